"""The ``<!-- small: next {...} -->`` doc directive (conftest.py): CI runs the block with its sizes
replaced, ``--run-slow-docs`` runs it as written, and a key the block no longer contains fails."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DOC = '''# A page

<!-- small: next {"steps = 12288": "steps = 512"} -->
```python
steps = 12288
```

```python
print("steps", steps)
```
'''


def _run_docs(tmp_path: Path, text: str, *flags: str) -> subprocess.CompletedProcess:
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(text)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                           "docs/page.md", *flags], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)


def test_ci_runs_the_block_small_and_counts_it(tmp_path):
    proc = _run_docs(tmp_path, DOC)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "steps 512" in proc.stdout
    assert "2 run (2 passed, 0 failed; 1 of them reduced by <!-- small -->)" in proc.stdout


def test_full_size_flag_runs_the_block_as_written(tmp_path):
    proc = _run_docs(tmp_path, DOC, "--run-slow-docs")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "steps 12288" in proc.stdout
    assert "1 of them at full size" in proc.stdout


def test_a_key_the_block_lost_fails_naming_it(tmp_path):
    proc = _run_docs(tmp_path, DOC.replace("steps = 12288\n```", "steps = 4096\n```"))
    assert proc.returncode == 1
    assert "no longer contains 'steps = 12288'" in proc.stdout


def test_a_malformed_table_is_a_clear_error(tmp_path):
    proc = _run_docs(tmp_path, DOC.replace('{"steps = 12288": "steps = 512"}', "[1, 2]"))
    assert proc.returncode != 0
    assert "needs a non-empty dict of str -> str" in proc.stdout + proc.stderr
