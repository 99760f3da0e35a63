"""README.md and docs/*.md name only files and modules that exist.

Checked: every relative Markdown link or image (``[text](x.md#anchor)``, resolved from the
document's folder; anchors are ignored), every repository path written in the text or in code
(``configs/...``, ``scripts/...``, ``docs/...``, ``tests/...``, ``models/...``, ``envs/...``,
``agents/...``, ``hexagent_gym/...``, ``.ci/...``; from the repository root, ``*`` globs and
``{a,b}`` alternatives expanded) and every dotted ``hexagent_gym.x.y`` name (a module, or an
attribute of one). The code blocks themselves run in the doc tests (conftest.py at the root).
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
REPO_PATH = re.compile(
    r"(?<![\w./~-])((?:configs|scripts|docs|tests|models|envs|agents|hexagent_gym|\.ci)/"
    r"(?:[\w.*-]|\{[\w.,-]+\}|/)*[\w*}/])")
DOTTED = re.compile(r"(?<![\w./])hexagent_gym(?:\.\w+)+")
NOT_PATHS = re.compile(r"^hexagent_gym/\w+-v\d+$")  # gymnasium ids: hexagent_gym/PDCluster-v0
NOT_MODULES = {"hexagent_gym.plugins"}  # the entry-point group (pyproject.toml)


def _expand(path: str) -> list[str]:
    """``a-x{2,4}.yaml`` -> ``a-x2.yaml``, ``a-x4.yaml``."""
    parts = re.split(r"\{([^}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def _missing_links(doc: Path, text: str) -> list[str]:
    missing = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-zA-Z][\w+.-]*:", target) or target.startswith("#"):
            continue  # a URL, mailto:, or an anchor on the same page
        target = target.split("#", 1)[0].split("?", 1)[0]
        if not (doc.parent / target).exists():
            missing.append(f"link ({m.group(1)})")
    return missing


def _missing_paths(text: str) -> list[str]:
    missing = []
    for m in REPO_PATH.finditer(text):
        path = m.group(1)
        if NOT_PATHS.match(path):
            continue
        for one in _expand(path):
            if not any(ROOT.glob(one.rstrip("/"))):
                missing.append(f"path {one}")
    return missing


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        module = ".".join(parts[:k])
        try:
            if importlib.util.find_spec(module) is not None:
                break
        except ModuleNotFoundError:
            continue
    else:
        return False
    if k == len(parts):
        return True
    try:
        obj = importlib.import_module(module)
    except ImportError as exc:  # an optional dependency (ray): the module exists
        return not (exc.name or "").startswith("hexagent_gym")
    for attr in parts[k:]:
        if not hasattr(obj, attr):
            return False
        obj = getattr(obj, attr)
    return True


def _missing_names(text: str) -> list[str]:
    names = sorted(set(DOTTED.findall(text)) - NOT_MODULES)
    return [f"name {n}" for n in names if not _resolves(n)]


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_doc_names_existing_files_and_modules(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    missing = _missing_links(doc, text) + _missing_paths(text) + _missing_names(text)
    assert not missing, f"{doc.relative_to(ROOT)} names what does not exist: {sorted(set(missing))}"


def test_checker_catches_drift(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    text = ("see [a](missing.md#top), `configs/experiments/paper_rates.yaml`, "
            "`configs/clusters/hetero-1-x{2,99}.yaml` and `hexagent_gym.no_such_module`; "
            "fine: [b](https://example.org), [c](#anchor), `configs/experiments/*.yaml`, "
            "`hexagent_gym/PDCluster-v0`, `hexagent_gym.policy.make_policy`")
    missing = _missing_links(doc, text) + _missing_paths(text) + _missing_names(text)
    assert missing == ["link (missing.md#top)", "path configs/experiments/paper_rates.yaml",
                       "path configs/clusters/hetero-1-x99.yaml",
                       "name hexagent_gym.no_such_module"]
