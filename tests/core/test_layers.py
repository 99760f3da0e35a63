"""The simulator core loads no RL library (docs/architecture.md, layers): checked in a fresh
interpreter, for every module of the core's folders and of the experiment runner."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "hexagent_gym"
HIGHER = {"envs", "agents", "scripts", "configs", "models", "data"}  # other layers, data


def core_modules() -> list[str]:
    """``hexagent_gym`` and every module below it, except the higher layers' sub-packages."""
    names = ["hexagent_gym"]
    for path in sorted(CORE.rglob("*.py")):
        parts = path.relative_to(CORE).with_suffix("").parts
        if parts[0] in HIGHER:
            continue
        names.append(".".join(("hexagent_gym", *parts)).removesuffix(".__init__"))
    return names


CORE_MODULES = core_modules()
FORBIDDEN = ["gymnasium", "torch", "stable_baselines3", "sb3_contrib", "tensorboard"]


def test_the_list_covers_the_core_folders():
    for name in ("hexagent_gym.sim.simulator", "hexagent_gym.planning.decisions",
                 "hexagent_gym.workload.workload", "hexagent_gym.cluster.latency",
                 "hexagent_gym.futures.horizon_predictors", "hexagent_gym.policy",
                 "hexagent_gym.experiments", "hexagent_gym.experiments.benchmark"):
        assert name in CORE_MODULES, name


def test_core_imports_no_rl_libraries():
    code = (
        "import importlib, sys\n"
        f"for m in {CORE_MODULES!r}: importlib.import_module(m)\n"
        f"print(','.join(m for m in {FORBIDDEN!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"core imported {out.stdout.strip()}"


def test_the_check_would_notice_an_rl_import():
    code = "import sys, gymnasium\nprint('gymnasium' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
