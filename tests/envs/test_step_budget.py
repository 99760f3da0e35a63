"""How much Python an env step and a simulated call run: bytecodes and function calls.

Wall time on this project's machine moves by a third within minutes, so CI's speed prints
cannot show a regression of a few tens of percent; a count of the interpreter's work can, and
it is deterministic (the same with every ``PYTHONHASHSEED``). The budgets sit about 15 % above
what CPython 3.11 counted when they were set (docs/performance.md: 2,819 bytecodes and 61
calls per env step; 5,823 bytecodes and 129 calls per simulated call of a warm HexAgent
rollout): a change that makes a step do more Python work must raise them on purpose. The code
of 3ffd06e (an earlier stop's, before the prefix cache's compiled kernels and leaner picks)
counted 3,425 bytecodes and 76 calls per step and 6,809 and 156 per call: over every budget.

Bytecode counts are specific to an interpreter's minor version (each release changes the
instruction set), and the pure-Python fallback runs several times the work of the compiled
kernels, so the budgets apply to CPython 3.11 with the kernels built.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
import pytest

from hexagent_gym.envs.benchmark import random_valid_steps
from hexagent_gym.envs.pd_cluster_env import PDClusterEnv
from hexagent_gym.planning import kernels

counted_here = pytest.mark.skipif(
    sys.version_info[:2] != (3, 11) or kernels.observe_step is None,
    reason="budgets counted on CPython 3.11 with the compiled kernels")

STEP_BUDGET = (3_200, 70)  # (bytecodes, Python calls) per env step
CALL_BUDGET = (6_600, 150)  # per simulated call of a warm HexAgent rollout


def python_work(run: Callable[[], object]) -> tuple[int, int]:
    """(bytecodes executed, Python function calls made) while ``run`` runs."""
    counts = [0, 0]

    def tracer(frame, event, arg):
        if event == "opcode":
            counts[0] += 1
        elif event == "call":
            frame.f_trace_opcodes = True
            counts[1] += 1
        return tracer

    previous = sys.gettrace()  # a coverage tool's or debugger's tracer, restored after
    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(previous)
    return counts[0], counts[1]


def test_tracer_counts_bytecodes_and_calls():
    def two_calls():
        return len([abs(-1), abs(-2)])  # builtins: no Python frame

    def outer():
        return two_calls() + two_calls()

    bytecodes, calls = python_work(outer)
    assert calls == 3 and bytecodes > 10  # outer and two_calls twice; none for the builtins


@counted_here
def test_env_step_budget():
    env = PDClusterEnv(cluster="hetero-1", trace="bfcl_v3", num_workflows=400, seed=0)
    env.factory.fill_horizons()
    rng = np.random.default_rng(0)
    random_valid_steps(env, 500, rng)  # the caches and the env's arrays, warm
    steps = 1000
    bytecodes, calls = python_work(lambda: random_valid_steps(env, steps, rng))
    assert bytecodes / steps <= STEP_BUDGET[0], f"{bytecodes / steps:.0f} bytecodes per step"
    assert calls / steps <= STEP_BUDGET[1], f"{calls / steps:.1f} Python calls per step"


@counted_here
def test_rollout_call_budget():
    env = PDClusterEnv(cluster="hetero-1", trace="bfcl_v3", num_workflows=100, load=1.0, seed=0)
    env.rollout("hexagent")  # horizons and the tables' caches, filled
    result = []
    bytecodes, calls = python_work(lambda: result.append(env.rollout("hexagent")))
    n = result[0].num_calls
    assert bytecodes / n <= CALL_BUDGET[0], f"{bytecodes / n:.0f} bytecodes per call"
    assert calls / n <= CALL_BUDGET[1], f"{calls / n:.1f} Python calls per call"
