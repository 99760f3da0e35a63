"""Synthetic long-context agent sessions: a workload that loads decode KV.

Our derived traces have short outputs (BFCL ≈ 26 tokens, LATS ≈ 45), so at the paper's rates
decode memory is nearly idle. Production agent traffic is different: Mooncake's released traces
(FAST'25) average 8.6k-token prompts with 182-token outputs (tool & agent) and 12k / 343
(conversation). :func:`agent_sessions` draws multi-turn sessions in that range:

- a session is a chain of ``turns`` calls (uniform in ``turns``);
- the first prompt is log-normal around ``first_prompt`` tokens (σ = 0.25), and it starts with
  a system prompt of ``system_tokens`` shared by every session (cross-session prefix reuse);
- each later prompt resends the previous call's input + output plus new tool or user content,
  log-normal around ``new_tokens`` (σ = 0.5);
- outputs are log-normal around ``output`` tokens (σ = 0.4), capped at ``max_output``;
- the wait before each later turn (tool / user) is uniform in ``tool_latency_s``.

Rows follow our JSONL schema (``prefix_of`` / ``prefix_tokens``, ``shared_prefix_key``), so the
prefix cache reuses them like any trace. Everything is drawn from the generator passed in.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def agent_sessions(n: int, rng: np.random.Generator, *, turns: tuple[int, int] = (3, 8),
                   first_prompt: float = 9000.0, system_tokens: int = 2048,
                   new_tokens: float = 400.0, output: float = 260.0, max_output: int = 1024,
                   tool_latency_s: tuple[float, float] = (0.5, 2.0),
                   max_prompt: int = 32000) -> list[dict[str, Any]]:
    """``n`` sessions as trace rows (dicts in our JSONL schema), ids ``sessions/<i>``."""
    if n < 1 or turns[0] < 1 or turns[1] < turns[0]:
        raise ValueError(f"need n >= 1 and 1 <= turns[0] <= turns[1], got n={n}, turns={turns}")
    rows = []
    for i in range(n):
        k = int(rng.integers(turns[0], turns[1] + 1))
        calls = []
        n_in = max(system_tokens + 64, int(first_prompt * np.exp(0.25 * rng.standard_normal())))
        for j in range(k):
            n_out = int(min(max_output, max(1.0, output * np.exp(0.4 * rng.standard_normal()))))
            call: dict[str, Any] = {
                "id": str(j), "parents": [str(j - 1)] if j else [], "input_tokens": n_in,
                "output_tokens": n_out, "kind": "agent_turn",
                "tool_latency_s": round(float(rng.uniform(*tool_latency_s)), 3) if j else 0.0,
                "shared_prefix_key": "agent_system", "shared_prefix_tokens": system_tokens,
            }
            if j:
                prev = calls[-1]
                call["prefix_of"] = prev["id"]
                call["prefix_tokens"] = prev["input_tokens"] + prev["output_tokens"]
            calls.append(call)
            grow = max(16, int(new_tokens * np.exp(0.5 * rng.standard_normal())))
            n_in = min(max_prompt, n_in + n_out + grow)
            if n_in >= max_prompt:
                break
        rows.append({"workflow_id": f"sessions/{i}", "source": "synthetic", "arrival_s": None,
                     "calls": calls, "meta": {"generator": "hexagent_gym.workload.synthetic",
                                              "turns": len(calls)}})
    return rows
