"""Every ```python and ```bash block in README.md and docs/*.md runs as a test, so the docs cannot
drift from the code.

The plugin is Sybil (the dev extra): it is maintained, it runs each Markdown file's blocks in
order in one shared namespace (a later block may use an earlier one's names, as a reader would),
and its HTML-comment directives keep the rendered docs clean: ``<!-- skip: next "reason" -->``
skips the next block, ``<!-- invisible-code-block: python ... -->`` runs hidden setup (e.g.
smaller sizes) before one. pytest-markdown-docs has no hidden setup blocks and marks blocks in
the visible fence info; pytest-codeblocks runs every block in isolation.

Directives used in the docs:

* ``<!-- skip: next "reason" -->``: never run here (creates a venv, needs a Ray cluster, hours).
* ``<!-- slow: next "reason" -->``: runs only with ``pytest --run-slow-docs`` (CI skips it).
* ``<!-- invisible-code-block: python ... -->``: hidden setup, mostly to run the next block small
  through ``doc_monkeypatch`` (a MonkeyPatch undone after the document).

Each document runs in its own temporary directory; ``configs``, ``models``, ``scripts``, ``tests``
and ``.venv`` are links to the repository's, ``docs/img`` is a fresh folder, so whatever a block
writes (``out/``, ``runs/``, ``results/``, ``docs/img/...``) lands in the temporary directory.
``python`` and ``hexagent-gym`` in bash blocks are the interpreter running pytest and its scripts.
A bash line that starts a server (``tensorboard``) is not run; the rest of its block is. A block
that uses Ray is skipped when ray (the ``distributed`` extra) is not installed.
``pytest -m "not docs"`` deselects the doc blocks; ``pytest README.md docs`` runs only them.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import SkipTest

import pytest
from sybil import Sybil
from sybil.evaluators.skip import Skipper
from sybil.integration.pytest import SybilItem
from sybil.parsers.abstract.skip import AbstractSkipParser
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer

ROOT = Path(__file__).resolve().parent
LINKED = ("configs", "models", "scripts", "tests", ".venv")  # read by the blocks, never written
SERVER_LINE = re.compile(r"^\s*(\.venv/bin/)?tensorboard\b")
USES_RAY = re.compile(r"^\s*import ray\b|\brllib", re.MULTILINE)
BASH_TIMEOUT_S = 300


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow-docs", action="store_true", default=False,
                     help="also run the doc blocks marked <!-- slow: next ... -->")


class SlowSkipper(Skipper):
    """``<!-- slow: next "reason" -->``: skip the next block unless --run-slow-docs."""

    run_slow = False

    def install(self, example, state, reason) -> None:
        example.document.push_evaluator(self)
        if self.run_slow:
            state.active = False  # the next block runs as usual
        else:
            why = eval(reason, {}) if reason else "slow"  # a quoted string
            state.exception = SkipTest(f"slow (--run-slow-docs runs it): {why}")


class SlowParser(AbstractSkipParser):
    directive = "slow"

    def __init__(self) -> None:
        super().__init__([DirectiveInHTMLCommentLexer(self.directive)])
        self.skipper = SlowSkipper(self.directive)


def run_bash(example) -> None:
    lines = [ln for ln in example.parsed.splitlines() if not SERVER_LINE.match(ln)]
    env = dict(os.environ, MPLBACKEND="Agg")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(lines)], cwd=os.getcwd(),
                          env=env, capture_output=True, text=True, timeout=BASH_TIMEOUT_S)
    if proc.returncode != 0:
        raise AssertionError(f"bash block exited {proc.returncode}\n--- stdout\n"
                             f"{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")


def _setup(namespace: dict) -> None:
    namespace["__name__"] = "__main__"  # as a reader runs a block: `if __name__ == "__main__":`


pytest_collect_file = Sybil(
    parsers=[PythonCodeBlockParser(), CodeBlockParser("bash", run_bash), SkipParser(),
             SlowParser()],
    patterns=["README.md", "docs/*.md"],
    setup=_setup,
    fixtures=["doc_monkeypatch"],
).pytest()


@pytest.fixture(scope="module")
def doc_monkeypatch(tmp_path_factory: pytest.TempPathFactory):
    """Per document (Sybil's file is the module scope): a fresh temporary working directory, and a
    MonkeyPatch that hidden setup blocks use to run a block small; undone after the document."""
    work = tmp_path_factory.mktemp("doc")
    for name in LINKED:
        if (ROOT / name).exists():
            (work / name).symlink_to(ROOT / name, target_is_directory=True)
    (work / "docs" / "img").mkdir(parents=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        mp.setenv("MPLBACKEND", "Agg")
        yield mp


def _kind(item: pytest.Item) -> str | None:
    if not isinstance(item, SybilItem):
        return None
    example = item.example
    head = example.document.text[example.region.start:example.region.start + 40]
    if head.lstrip().startswith("```"):
        return "block"
    return "setup" if "code-block" in head else "directive"


def pytest_configure(config: pytest.Config) -> None:
    SlowSkipper.run_slow = config.getoption("--run-slow-docs")


@pytest.hookimpl(tryfirst=True)  # before -m selects on the marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    config._doc_kinds = {}
    for item in items:
        kind = _kind(item)
        if kind is not None:
            item.add_marker(pytest.mark.docs)
            config._doc_kinds[item.nodeid] = kind


def pytest_runtest_setup(item: pytest.Item) -> None:
    if (isinstance(item, SybilItem) and USES_RAY.search(str(item.example.parsed))
            and importlib.util.find_spec("ray") is None):
        pytest.skip("needs ray: pip install -e '.[distributed]'")


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    kinds = getattr(config, "_doc_kinds", {})
    if not kinds:
        return
    outcomes: dict[str, str] = {}  # nodeid -> passed | failed | slow | skipped, blocks only
    for outcome in ("passed", "failed", "error", "skipped"):
        for report in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(report, "nodeid", None)
            if kinds.get(nodeid) != "block" or outcomes.get(nodeid) in ("failed", "error"):
                continue
            slow = outcome == "skipped" and "slow (--run-slow-docs" in str(report.longrepr)
            outcomes[nodeid] = "slow" if slow else outcome
    if not outcomes:
        return  # none ran (-m "not docs", or only tests/ collected)
    n = {k: sum(v == k for v in outcomes.values()) for k in ("passed", "failed", "error", "slow",
                                                            "skipped")}
    bad = n["failed"] + n["error"]
    terminalreporter.write_line(
        f"doc code blocks: {len(outcomes)} collected, {n['passed'] + bad} run ({n['passed']} "
        f"passed, {bad} failed), {n['slow']} skipped as slow (--run-slow-docs), {n['skipped']} "
        f"skipped (not runnable here); {sum(k == 'setup' for k in kinds.values())} hidden setup "
        f"blocks")
