"""The project's imports form layers that point one way, with no circle.

Read from the source (AST), so imports inside functions count too. Layers, top to bottom:
``scripts`` → ``agents`` → ``envs`` → ``hexagent_gym.experiments`` → ``hexagent_gym`` (the
simulator core). The folders ``scripts/``, ``agents/`` and ``envs/`` install as
``hexagent_gym.scripts`` ... (pyproject's package-dir), and every import uses those names. A module
may import its own layer or any lower one, never a higher one.
``hexagent_gym.evaluation``/``distributed``/``plots`` are thin re-exports of the experiment runner
and belong to its layer.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("hexagent_gym", "envs", "agents", "scripts")
MAPPED = ("envs", "agents", "scripts", "configs", "models")  # folder -> hexagent_gym.<folder>
RUNNER_SHIMS = {"hexagent_gym.evaluation", "hexagent_gym.distributed", "hexagent_gym.plots"}
RANK = {"core": 0, "experiments": 1, "envs": 2, "agents": 3, "scripts": 4}


def layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "hexagent_gym" and len(parts) > 1 and parts[1] in MAPPED:
        return parts[1]
    top = parts[0]
    if top == "hexagent_gym":
        if module.startswith("hexagent_gym.experiments") or module in RUNNER_SHIMS:
            return "experiments"
        return "core"
    return top


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] in MAPPED:
        parts.insert(0, "hexagent_gym")
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """Project modules imported anywhere in ``path`` (module and function level)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in known:  # `from pkg import mod` names a module, else the package
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def import_graph() -> nx.DiGraph:
    mods = project_modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(mods)
    for name, path in mods.items():
        for target in imports_of(path, name, set(mods)):
            if not (path.name == "__init__.py" and target.startswith(name + ".")) and not (
                    name.startswith(target + ".") and target in mods
                    and mods[target].name == "__init__.py"):
                graph.add_edge(name, target)
    return graph


def test_no_import_circles():
    cycles = list(nx.simple_cycles(import_graph()))
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c + [c[0]]) for c in cycles)


def test_imports_point_down_the_layers():
    upward = [f"{a} ({layer(a)}) imports {b} ({layer(b)})"
              for a, b in import_graph().edges if RANK[layer(b)] > RANK[layer(a)]]
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def test_the_core_names_no_module_of_a_higher_layer():
    # not even as an entry-point string: higher layers plug in through package metadata
    named = re.compile(r"^(hexagent_gym\.)?(agents|envs|scripts)\.[A-Za-z_][\w.]*(:\w+)?$")
    hits = []
    for name, path in project_modules().items():
        if layer(name) not in ("core", "experiments"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and named.match(node.value):
                hits.append(f"{name}: {node.value!r}")
    assert not hits, "\n".join(hits)


def test_nothing_imports_a_generic_top_level_name():
    # the folders install as hexagent_gym.<folder> only: a bare `import envs` works in a checkout
    # whose root is on sys.path (pytest's) but not for a user of the wheel
    bare = []
    for path in [*ROOT.joinpath("tests").rglob("*.py"),
                 *(p for pkg in PACKAGES for p in ROOT.joinpath(pkg).rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom)
                     and not node.level else [])
            bare += [f"{path.relative_to(ROOT)}: {n}" for n in names
                     if n.split(".")[0] in MAPPED]
    assert not bare, "\n".join(bare)


def test_the_checks_see_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("from pkg.a import f\n")
    known = {"pkg", "pkg.a", "pkg.b"}
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert imports_of(pkg / "a.py", "pkg.a", known) == {"pkg", "pkg.b"}  # function level
        assert imports_of(pkg / "b.py", "pkg.b", known) == {"pkg.a"}
    finally:
        ROOT = saved
