"""Cost of overloaded episodes: wall time per simulated call as the queue grows
(``scripts/bench.py`` prints it; docs/overload.md).

At the paper's 40 workflows/s hetero-1 serving BFCL-v3 is offered about 7 times what it can
serve, so queues grow without bound and a longer episode holds longer queues. An invocation
that re-plans every waiting call then costs O(queue), and an episode O(calls × queue): its cost
per call grows with its length. With ``plan_depth`` an invocation re-plans a bounded window and
the cost per call stays flat; this table shows both per policy, one row per episode length.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from dataclasses import dataclass

from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.policy import make_policy, run_policy

OVERLOAD_SIZES = (500, 2000, 5000)
"""Episode lengths (workflows) of the full table."""
OVERLOAD_DEPTH = 32
"""The ``plan_depth`` the table runs (docs/overload.md measures its effect on Req99)."""
FLAT_GOAL = 1.5
"""The goal on :func:`flat_ratio`: wall time per call on the longest episode at most this
many times the shortest's (issue 41)."""


@dataclass(frozen=True)
class OverloadRow:
    """One policy on one episode length (the fastest of the timed runs)."""

    policy: str
    num_workflows: int
    num_calls: int
    seconds: float  # wall time of the rollout (run_policy), standalone horizons cached
    decisions: int  # picks made (calls planned, summed over invocations)
    req99: float
    plan_depth: int | None

    @property
    def us_per_call(self) -> float:
        return 1e6 * self.seconds / self.num_calls

    @property
    def picks_per_call(self) -> float:
        return self.decisions / self.num_calls


def bench_overload(policies: Sequence[str], sizes: Sequence[int] = OVERLOAD_SIZES,
                   cluster: str = "hetero-1", trace: str = "bfcl_v3",
                   arrival_rate: float = 40.0, plan_depth: int | None = OVERLOAD_DEPTH,
                   seed: int = 0, repeat: int = 1) -> list[OverloadRow]:
    """Time one rollout of every policy on episodes of each length in ``sizes`` at
    ``arrival_rate`` (the best of ``repeat``, policies alternating within a round so that the
    machine's drift hits them alike). A fallback run per length fills the standalone-horizon
    cache first, so the rows time scheduling and simulation only. Rows: by size, then by
    policy, in the order given."""
    rows = []
    for n in sizes:
        factory = EpisodeFactory(EpisodeConfig(cluster=cluster, trace=trace, num_workflows=n,
                                               arrival_rate=arrival_rate, load=None,
                                               plan_depth=plan_depth, seed=seed))
        factory.simulator(decisions=False).run(close=True)
        best: dict[str, tuple[float, object]] = {}
        for _ in range(repeat):
            for name in policies:
                sim = factory.simulator()
                policy = make_policy(name)
                gc.collect()  # not inside the timed run: run_policy pauses the collector
                t0 = time.perf_counter()
                result = run_policy(sim, policy, close=True)
                seconds = time.perf_counter() - t0
                if name not in best or seconds < best[name][0]:
                    best[name] = (seconds, result)
        for name in policies:
            seconds, result = best[name]
            rows.append(OverloadRow(name, n, result.num_calls, seconds, result.decisions,
                                    result.req99, plan_depth))
    return rows


def flat_ratio(rows: Sequence[OverloadRow], policy: str) -> float:
    """The policy's wall time per call on its longest episode over its shortest's."""
    mine = sorted((r for r in rows if r.policy == policy), key=lambda r: r.num_workflows)
    return mine[-1].us_per_call / mine[0].us_per_call


def over_goal(rows: Sequence[OverloadRow], goal: float = FLAT_GOAL) -> list[tuple[str, float]]:
    """(policy, :func:`flat_ratio`) of every policy of ``rows`` above ``goal``, in row order
    (none with a single episode length)."""
    policies = list(dict.fromkeys(r.policy for r in rows))
    if len({r.num_workflows for r in rows}) < 2:
        return []
    ratios = [(p, flat_ratio(rows, p)) for p in policies]
    return [(p, x) for p, x in ratios if x > goal]
