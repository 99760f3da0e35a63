"""The built wheel, installed into a fresh venv: one top-level package (``hexagent_gym``), the
gymnasium id registered by ``import hexagent_gym``, and no generic names (``envs``, ``agents``,
``scripts``, ``configs``, ``models``) importable from outside the checkout.

The fresh venv takes its dependencies (gymnasium, torch, ...) from the test's own environment
through a ``.pth`` line; that adds the folder as a plain path entry, so the checkout's editable
install there (a ``.pth`` hook of its own) stays inactive and only the wheel provides
``hexagent_gym``.
"""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GENERIC = ("envs", "agents", "scripts", "configs", "models")


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> tuple[Path, Path]:
    """(the fresh venv's python, the wheel) with the wheel installed and no editable install."""
    tmp = tmp_path_factory.mktemp("wheel")
    # build from a copy of the tracked files: setuptools' build/ folder in a checkout keeps
    # stale files of earlier builds, which would end up in the wheel
    source = tmp / "source"
    listed = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    files = subprocess.run(listed, cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-q", "-w", str(tmp / "dist"), str(source)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp / "dist").glob("hexagent_gym-*.whl")
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; "
                                   "print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    deps = {sysconfig.get_paths()["purelib"], *site.getsitepackages()}
    (purelib / "_test_dependencies.pth").write_text("\n".join(sorted(deps)) + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                              "--no-deps", "--no-index", "-q", str(wheel)],
                             capture_output=True, text=True)
    assert install.returncode == 0, install.stderr
    return python, wheel


def run_outside(python: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=cwd)


def test_the_wheel_holds_one_top_level_package(fresh_venv):
    _, wheel = fresh_venv
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
        names = archive.namelist()
    assert {t for t in tops if not t.endswith(".dist-info")} == {"hexagent_gym"}
    for sub in GENERIC:  # the checkout's folders live inside it
        assert f"hexagent_gym/{sub}/__init__.py" in names, sub
    assert "hexagent_gym/models/learned_hetero1_bfcl.zip" in names
    assert any(n.startswith("hexagent_gym/configs/clusters/") for n in names)


def test_import_hexagent_gym_registers_the_id_outside_the_clone(fresh_venv, tmp_path):
    python, _ = fresh_venv
    code = ("import gymnasium as gym, hexagent_gym\n"
            "env = gym.make('hexagent_gym/PDCluster-v0', cluster='tiny-2p2d', num_workflows=4)\n"
            "env.reset(seed=0)\n"
            "print(hexagent_gym.__file__)\n"
            "print(hexagent_gym.make(num_workflows=5).rollout('learned', seed=0).num_workflows)\n")
    out = run_outside(python, code, tmp_path)
    assert out.returncode == 0, out.stderr
    where, count = out.stdout.split()
    assert not Path(where).resolve().is_relative_to(ROOT)  # the wheel's copy, not the checkout
    assert count == "5"


@pytest.mark.parametrize("name", GENERIC)
def test_generic_names_are_not_importable(fresh_venv, tmp_path, name):
    python, _ = fresh_venv
    out = run_outside(python, f"import {name}", tmp_path)
    assert out.returncode != 0
    assert f"No module named '{name}'" in out.stderr


def test_the_console_command_runs(fresh_venv, tmp_path):
    python, _ = fresh_venv
    out = subprocess.run([str(python.parent / "hexagent-gym"), "--help"], capture_output=True,
                         text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "evaluate" in out.stdout
