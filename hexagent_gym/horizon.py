"""Standalone horizons H_w: each workflow run alone on the empty cluster (docs/simulator.md).

H_w is the metric's denominator, so it uses true service times (no estimation error) and the
core's fallback placement (earliest projected finish) through the same simulator, which makes
C_w = H_w exactly (up to floating-point rounding) for a workflow served alone under the fallback.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from hexagent_gym.cluster import ClusterSpec
    from hexagent_gym.planner import ClusterTables
    from hexagent_gym.workload import WorkflowSpec


class HorizonCache:
    """Memoised standalone completion times per workflow spec on one cluster.

    Keyed by object identity: traces are immutable and cached by the loader, so the same spec
    objects recur across episodes; the cache holds a reference to keep each key alive.
    """

    def __init__(self, cluster: ClusterSpec, tables: ClusterTables | None = None, *,
                 prefix_cache: bool = True, prefix_cache_tokens: float | None = None,
                 parallel_sampling: bool = True) -> None:
        from hexagent_gym.planner import ClusterTables

        self.cluster = cluster
        self.tables = tables if tables is not None else ClusterTables(cluster)
        self.serving = {"prefix_cache": prefix_cache, "prefix_cache_tokens": prefix_cache_tokens,
                        "parallel_sampling": parallel_sampling}
        self._cache: dict[int, tuple[WorkflowSpec, float]] = {}

    def get(self, spec: WorkflowSpec) -> float:
        """H_w of one workflow in seconds (computed once per spec)."""
        hit = self._cache.get(id(spec))
        if hit is not None and hit[0] is spec:
            return hit[1]
        value = standalone_time(self.cluster, spec, self.tables, **self.serving)
        self._cache[id(spec)] = (spec, value)
        return value

    def __len__(self) -> int:
        return len(self._cache)


def standalone_time(cluster: ClusterSpec, spec: WorkflowSpec,
                    tables: ClusterTables | None = None, *, prefix_cache: bool = True,
                    prefix_cache_tokens: float | None = None,
                    parallel_sampling: bool = True) -> float:
    """Completion time of ``spec`` arriving at t = 0 on the empty cluster, served alone (with a
    cold prefix cache: only the workflow's own earlier prompts can hit)."""
    from hexagent_gym.planner import ClusterTables

    tables = tables if tables is not None else ClusterTables(cluster)
    if not prefix_cache and _is_chain(spec):
        return _chain_time(tables, spec)
    return _simulated_time(cluster, spec, tables, prefix_cache=prefix_cache,
                           prefix_cache_tokens=prefix_cache_tokens,
                           parallel_sampling=parallel_sampling)


def _is_chain(spec: WorkflowSpec) -> bool:
    calls = spec.calls
    return all(c.parents == ((i - 1,) if i else ()) for i, c in enumerate(calls))


def _chain_time(tables: ClusterTables, spec: WorkflowSpec) -> float:
    """A chain runs one call at a time on an idle cluster, so the simulation reduces to a sum.

    This replays the simulator's own arithmetic step by step (same placement function, same
    additions on the absolute clock, the decode clock of an idle instance starting at 0), so it
    returns bit-for-bit what the event loop would; ``tests/core/test_horizon.py`` checks it.
    """
    from hexagent_gym.entities import Call
    from hexagent_gym.planner import earliest_pair

    P, D = tables.num_prefill, tables.num_decode
    zeros_f, zeros_i = [0.0] * D, [0] * D
    now = 0.0
    for i, cs in enumerate(spec.calls):
        if i:
            now = now + cs.tool_latency_s
        call = Call(i, None, i, cs, cs.output_tokens, 1.0, 1.0)
        call.pf_true, call.pf_cls = tables.prefill_times(cs.input_tokens)
        call.pf_est = call.pf_cold = call.pf_true
        p, d, _ = earliest_pair(tables, now, [now] * P, zeros_f, zeros_i, zeros_f, call,
                                _never_binds)
        now = now + call.pf_true[p]
        now = now + (tables.setup_list[p][d] + cs.input_tokens * tables.spt_list[p][d])
        v_finish = 0.0 + cs.output_tokens
        ctx = (0.0 + (cs.input_tokens + 0.5 * v_finish - 0.0)) + 1 * (0.0 - 1.0) * 0.5
        step = tables.cluster.decode[d].latency.decode_step_time(1, ctx)
        now = now + (v_finish - 0.0) * step
    return now


def _never_binds(d: int, need: float, over: int) -> float:
    raise AssertionError("an empty cluster cannot bind a decode limit for a call that fits")


def _simulated_time(cluster: ClusterSpec, spec: WorkflowSpec, tables: ClusterTables,
                    **serving) -> float:
    from hexagent_gym.arrivals import EpisodeWorkload
    from hexagent_gym.simulator import Simulator

    workload = EpisodeWorkload((spec,), np.zeros(1), np.zeros(1, dtype=np.int64))
    sim = Simulator(cluster, workload, decisions=False, compute_horizons=False, tables=tables,
                    **serving)
    sim.run_until_decision()
    return sim.workflows[0].finish_t
