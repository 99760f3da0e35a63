"""A synthetic multi-application trace family: training episodes for a learned scheduler that
must use workflow futures, without training on BFCL-v3 (which it is then tested on).

Each workflow is a multi-turn session of one *application*, drawn by
``hexagent_gym.workload.synthetic.agent_sessions`` with the application's turn range, prompt and
output sizes. Applications differ mostly in how many turns follow the first call, so a front end
that knows the application id (and the finished sessions of each) can forecast a session's final
horizon, while the running horizon H_w(t) of the calls revealed so far underestimates the long
ones: the situation in which ``hexagent-horizon`` helps. The sizes are BFCL-like (prompts of a
few thousand tokens that mostly resend the previous turn, short outputs), but the generator,
its turn distributions and its application ids share nothing with BFCL-v3's workflows.

Rows follow the JSONL schema (docs/traces.md), with an ``app_id`` key per row; workflow ids are
``synth/<app>/<i>`` so the train/eval split (CRC-32 parity of the id) applies as to any trace.
Everything is drawn from one seed, so :func:`write_app_sessions` writes the same file anywhere.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np

from hexagent_gym.workload.synthetic import agent_sessions

APPS: dict[str, dict[str, Any]] = {
    # name: (share of sessions, agent_sessions keyword arguments)
    "qa": {"share": 0.45, "turns": (1, 1), "first_prompt": 3500.0, "output": 60.0},
    "lookup": {"share": 0.25, "turns": (2, 3), "first_prompt": 4500.0, "output": 30.0},
    "planner": {"share": 0.18, "turns": (4, 8), "first_prompt": 5000.0, "output": 30.0},
    "agent": {"share": 0.12, "turns": (8, 14), "first_prompt": 3000.0, "output": 40.0},
}
"""The applications: their share of sessions and their ``agent_sessions`` parameters (every
application: a 1,024-token system prompt of its own, about 150 new tokens per turn, tool waits
of 0.2–1.5 s)."""


def app_sessions(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` sessions as trace rows, applications drawn by :data:`APPS` shares, from ``seed``."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rng = np.random.default_rng(seed)
    names = list(APPS)
    shares = np.array([APPS[a]["share"] for a in names])
    draws = rng.choice(len(names), size=n, p=shares / shares.sum())
    rows = []
    for i, a in enumerate(draws):
        app = names[int(a)]
        params = {k: v for k, v in APPS[app].items() if k != "share"}
        (row,) = agent_sessions(1, rng, system_tokens=1024, new_tokens=150.0,
                                tool_latency_s=(0.2, 1.5), **params)
        for call in row["calls"]:
            call["shared_prefix_key"] = f"synth_{app}"
        row.update(workflow_id=f"synth/{app}/{i}", source="synth_apps", app_id=f"synth/{app}",
                   meta={"generator": "hexagent_gym.envs.app_sessions"})
        rows.append(row)
    return rows


def write_app_sessions(path: str | Path, n: int = 1200, seed: int = 0) -> Path:
    """Write :func:`app_sessions` (``n``, ``seed``) to ``path`` (``.jsonl.gz``) unless a file is
    already there; returns the path. Deterministic, so an existing file holds the same rows."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with gzip.open(tmp, "wt") as f:
            for row in app_sessions(n, seed):
                f.write(json.dumps(row) + "\n")
        tmp.replace(path)
    return path


__all__ = ["APPS", "app_sessions", "write_app_sessions"]
