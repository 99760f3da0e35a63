"""The project's imports form layers that point one way, with no circle.

Read from the source (AST), so imports inside functions (and under ``TYPE_CHECKING``) count too.
Layers, top to bottom: ``scripts`` → ``agents`` → ``envs`` → ``hexagent_gym.experiments`` →
``hexagent_gym`` (the simulator core). The folders ``scripts/``, ``agents/`` and ``envs/`` install
as ``hexagent_gym.scripts`` ... (pyproject's package-dir), and every import uses those names. A
module may import its own layer or any lower one, never a higher one.

Inside the core the folders are ordered too (CORE_FOLDERS, docs/architecture.md): a module imports
its own folder or an earlier one in the list, never a later one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("hexagent_gym", "envs", "agents", "scripts")
MAPPED = ("envs", "agents", "scripts", "configs", "models")  # folder -> hexagent_gym.<folder>
RANK = {"core": 0, "experiments": 1, "envs": 2, "agents": 3, "scripts": 4}

# The core's folders in dependency order, bottom first. A core module belongs to the longest
# entry that is its name or a dotted prefix of it: ``hexagent_gym.config`` is the foundation every
# folder may read, and ``hexagent_gym`` (last) holds the top-level modules, the public API
# (episode, policy, registry, gym_hook, the package's __init__).
CORE_FOLDERS = [
    "hexagent_gym.config",
    "hexagent_gym.workload",  # what arrives: specs, traces, arrivals
    "hexagent_gym.cluster",  # the hardware and its speeds
    "hexagent_gym.planning",  # entities, Ŝ, Δ, DecisionPoint, compiled kernels
    "hexagent_gym.futures",  # output-length and horizon forecasts
    "hexagent_gym.sim",  # the event engine, horizons H_w, timelines, metrics
    "hexagent_gym",
]
# the modules allowed directly in hexagent_gym/ (a new core module goes into a folder)
TOP_LEVEL = {"config", "episode", "policy", "registry", "gym_hook"}
NOT_CORE_FOLDERS = {"experiments", "data", *MAPPED}


def layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "hexagent_gym" and len(parts) > 1 and parts[1] in MAPPED:
        return parts[1]
    top = parts[0]
    if top == "hexagent_gym":
        if module.startswith("hexagent_gym.experiments"):
            return "experiments"
        return "core"
    return top


def core_folder(module: str) -> str:
    """The CORE_FOLDERS entry of a core module."""
    return max((f for f in CORE_FOLDERS if module == f or module.startswith(f + ".")), key=len)


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


def folder_order_violations(edges) -> list[str]:
    """Core imports that point from a folder to a later one of CORE_FOLDERS."""
    rank = {f: i for i, f in enumerate(CORE_FOLDERS)}
    return sorted(f"{a} ({core_folder(a)}) imports {b} ({core_folder(b)})" for a, b in edges
                  if layer(a) == layer(b) == "core"
                  and rank[core_folder(b)] > rank[core_folder(a)])


def test_no_import_circles():
    cycles = list(nx.simple_cycles(import_graph()))
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c + [c[0]]) for c in cycles)


def test_imports_point_down_the_layers():
    upward = [f"{a} ({layer(a)}) imports {b} ({layer(b)})"
              for a, b in import_graph().edges if RANK[layer(b)] > RANK[layer(a)]]
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def test_the_core_folders_import_one_way():
    bad = folder_order_violations(import_graph().edges)
    assert not bad, "imports of a later core folder:\n" + "\n".join(bad)


def test_every_core_module_sits_in_a_listed_folder():
    core = ROOT / "hexagent_gym"
    loose = sorted(p.name for p in core.glob("*.py")
                   if p.stem != "__init__" and p.stem not in TOP_LEVEL)
    assert not loose, f"modules at the top of hexagent_gym/ (put them in a folder): {loose}"
    folders = {f"hexagent_gym.{p.name}" for p in core.iterdir()
               if p.is_dir() and (p / "__init__.py").exists() and p.name not in NOT_CORE_FOLDERS}
    assert folders == set(CORE_FOLDERS) - {"hexagent_gym", "hexagent_gym.config"}, (
        "CORE_FOLDERS must list every folder of the core exactly once")


def test_the_folder_order_check_notices_a_backward_import():
    edges = [("hexagent_gym.sim.engine", "hexagent_gym.planning.decisions"),
             ("hexagent_gym.workload.specs", "hexagent_gym.config"),
             ("hexagent_gym.planning.entities", "hexagent_gym.sim.engine"),
             ("hexagent_gym.config", "hexagent_gym.episode"),
             ("hexagent_gym.experiments.grid", "hexagent_gym.episode")]
    assert folder_order_violations(edges) == [
        "hexagent_gym.config (hexagent_gym.config) imports hexagent_gym.episode (hexagent_gym)",
        "hexagent_gym.planning.entities (hexagent_gym.planning) imports hexagent_gym.sim.engine"
        " (hexagent_gym.sim)"]


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
