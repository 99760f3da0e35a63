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
* ``<!-- small: next {"as written": "smaller", ...} -->``: a block that takes minutes as written
  runs small: each key (text in the block, which must be there) is replaced by its value before
  the block runs, e.g. ``{"--total-timesteps 12288": "--total-timesteps 512"}``. The block still
  runs end to end with its real commands, so CI catches a renamed flag or a broken script; only
  its sizes shrink. ``pytest --run-slow-docs`` runs such blocks as written, at full size.
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

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.example import NotEvaluated
from sybil.integration.pytest import SybilItem
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer
from sybil.region import Lexeme, Region

ROOT = Path(__file__).resolve().parent
LINKED = ("configs", "models", "scripts", "tests", ".venv")  # read by the blocks, never written
SERVER_LINE = re.compile(r"^\s*(\.venv/bin/)?tensorboard\b")
USES_RAY = re.compile(r"^\s*import ray\b|\brllib", re.MULTILINE)
BASH_TIMEOUT_S = 300


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow-docs", action="store_true", default=False,
                     help="run the doc blocks marked <!-- small: next ... --> at full size")


class SmallRunner:
    """``<!-- small: next {...} -->``: run the next block with its sizes replaced (see above).

    An evaluator pushed onto the document for one block: it rewrites that block's source and
    raises ``NotEvaluated`` so the block's own evaluator (python or bash) runs the rewritten text.
    """

    full_size = False  # pytest --run-slow-docs
    ran_small = 0  # blocks under the directive run this session, for the summary line

    def __init__(self) -> None:
        self.pending: dict = {}  # document -> the substitutions for its next block

    def __call__(self, example) -> None:
        document = example.document
        if example.region.evaluator is self:  # the directive itself
            action, table = example.parsed
            if action != "next":
                raise ValueError(f"'small: {action}': only 'small: next {{...}}' is supported")
            self.pending[document] = table
            document.push_evaluator(self)
            return
        document.pop_evaluator(self)
        table = self.pending.pop(document)
        if not self.full_size:
            source = str(example.parsed)
            for written, small in table.items():
                if written not in source:
                    raise AssertionError(f"<!-- small --> before line {example.line}: the block "
                                         f"no longer contains {written!r}; update the directive")
                source = source.replace(written, small)
            example.parsed = Lexeme(source, example.parsed.offset, example.parsed.line_offset)
        SmallRunner.ran_small += 1
        raise NotEvaluated()  # the block's own evaluator runs the (rewritten) text


class SmallParser:
    """Parses ``<!-- small: next {"as written": "smaller"} -->`` (a Python dict literal)."""

    def __init__(self) -> None:
        self.lexer = DirectiveInHTMLCommentLexer("small")
        self.runner = SmallRunner()

    def __call__(self, document):
        for lexed in self.lexer(document):
            action, _, table = (lexed.lexemes["arguments"] or "").strip().partition(" ")
            try:
                table = ast.literal_eval(table.strip())
            except (ValueError, SyntaxError) as exc:
                raise ValueError(f"{document.path}: <!-- small: next {{...}} --> needs a dict "
                                 f"literal of str -> str, got {table!r}") from exc
            if not (isinstance(table, dict) and table
                    and all(isinstance(k, str) and isinstance(v, str) for k, v in table.items())):
                raise ValueError(f"{document.path}: <!-- small --> needs a non-empty dict of "
                                 f"str -> str, got {table!r}")
            yield Region(lexed.start, lexed.end, (action, table), self.runner)


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
             SmallParser()],
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
    SmallRunner.full_size = config.getoption("--run-slow-docs")


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
    outcomes: dict[str, str] = {}  # nodeid -> passed | failed | error | skipped, blocks only
    for outcome in ("passed", "failed", "error", "skipped"):
        for report in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(report, "nodeid", None)
            if kinds.get(nodeid) != "block" or outcomes.get(nodeid) in ("failed", "error"):
                continue
            outcomes[nodeid] = outcome
    if not outcomes:
        return  # none ran (-m "not docs", or only tests/ collected)
    n = {k: sum(v == k for v in outcomes.values()) for k in ("passed", "failed", "error",
                                                            "skipped")}
    bad = n["failed"] + n["error"]
    size = "at full size" if SmallRunner.full_size else "reduced by <!-- small -->"
    terminalreporter.write_line(
        f"doc code blocks: {len(outcomes)} collected, {n['passed'] + bad} run ({n['passed']} "
        f"passed, {bad} failed; {SmallRunner.ran_small} of them {size}), {n['skipped']} "
        f"skipped (not runnable here); {sum(k == 'setup' for k in kinds.values())} hidden setup "
        f"blocks")
