"""A policy that sleeps before its episode and is fcfs otherwise: slow or stuck cells for the
runner's stop and timeout tests, plus helpers to find a process's children on Linux.

The delay is the policy's ``seconds`` argument, or ``$HEXAGENT_TEST_SLEEP_S`` when set: the
same cells (same keys, same records) run slowly in one run and quickly in the next.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from hexagent_gym import policy as policy_module
from hexagent_gym.policy import make_policy, policy_names, register_policy

NAME = "sleepy"
SLEEP_ENV = "HEXAGENT_TEST_SLEEP_S"
ROOT = Path(__file__).resolve().parents[2]
# A command line that runs scripts/evaluate.py with this policy registered (append the flags).
EVALUATE = [sys.executable, "-c",
            "from tests.experiments.slow_policy import register; register()\n"
            "from scripts.evaluate import main\n"
            "raise SystemExit(main())\n"]
TINY_FLAGS = ["--clusters", "tiny-2p2d", "--traces", "bfcl_v3", "--num-workflows", "6",
              "--load", "1.0", "--quiet"]


def sleepy(seconds: float = 0.0, exit_code: int | None = None):
    """fcfs, whose ``reset`` first sleeps ``seconds`` (or ``$HEXAGENT_TEST_SLEEP_S``), or ends
    its process at once with ``exit_code`` (a worker that dies mid-cell)."""
    policy = make_policy("fcfs")
    delay = float(os.environ.get(SLEEP_ENV, seconds))
    reset = policy.reset

    def slow_reset(sim):
        if exit_code is not None:
            os._exit(exit_code)
        time.sleep(delay)
        reset(sim)

    policy.reset = slow_reset
    return policy


def register() -> None:
    """Register :func:`sleepy` for good (a driver process; tests use :func:`registered`)."""
    if NAME not in policy_names():
        register_policy(NAME, sleepy)


def registered(monkeypatch) -> None:
    """Register :func:`sleepy` until the test ends (forked workers inherit it)."""
    policy_names()  # load the plugins first, so they do not run into the test's entry
    monkeypatch.setitem(policy_module._POLICIES._entries, NAME, sleepy)


def children(pid: int) -> list[int]:
    """The live (not zombie) processes whose parent is ``pid``, from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            state = _stat(int(entry.name))
            if state is not None and state[1] == pid and state[0] != "Z":
                out.append(int(entry.name))
    return out


def alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie (an orphan's zombie waits for a reaper that, in a
    container, may never come)."""
    state = _stat(pid)
    return state is not None and state[0] != "Z"


def wait_until(predicate, timeout: float, step: float = 0.05):
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout`` passes
    (returns the last falsy value)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


def _stat(pid: int) -> tuple[str, int] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the name in parentheses may hold spaces
    return fields[0], int(fields[1])
