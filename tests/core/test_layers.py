"""The simulator core loads no RL library (docs/architecture.md, layers): checked in a fresh
interpreter."""

from __future__ import annotations

import subprocess
import sys

CORE_MODULES = [
    "hexagent_gym", "hexagent_gym.simulator", "hexagent_gym.planner", "hexagent_gym.decisions",
    "hexagent_gym.workload", "hexagent_gym.arrivals", "hexagent_gym.cluster",
    "hexagent_gym.latency", "hexagent_gym.horizon", "hexagent_gym.metrics",
    "hexagent_gym.benchmark", "hexagent_gym.load", "hexagent_gym.decode_reference",
    "hexagent_gym.engine", "hexagent_gym.instance_flow", "hexagent_gym.plan_flow",
    "hexagent_gym.plan_state", "hexagent_gym.projections", "hexagent_gym.placement",
    "hexagent_gym.cluster_tables", "hexagent_gym.call_batch", "hexagent_gym.workflow_parser",
    "hexagent_gym.policy", "hexagent_gym.experiments",
]
FORBIDDEN = ["gymnasium", "torch", "stable_baselines3", "sb3_contrib", "tensorboard"]


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
