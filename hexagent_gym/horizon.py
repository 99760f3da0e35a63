"""Standalone horizons H_w: each workflow run alone on the empty cluster (DESIGN §2).

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

    def __init__(self, cluster: ClusterSpec, tables: ClusterTables | None = None) -> None:
        from hexagent_gym.planner import ClusterTables

        self.cluster = cluster
        self.tables = tables if tables is not None else ClusterTables(cluster)
        self._cache: dict[int, tuple[WorkflowSpec, float]] = {}

    def get(self, spec: WorkflowSpec) -> float:
        """H_w of one workflow in seconds (computed once per spec)."""
        hit = self._cache.get(id(spec))
        if hit is not None and hit[0] is spec:
            return hit[1]
        value = standalone_time(self.cluster, spec, self.tables)
        self._cache[id(spec)] = (spec, value)
        return value

    def __len__(self) -> int:
        return len(self._cache)


def standalone_time(cluster: ClusterSpec, spec: WorkflowSpec,
                    tables: ClusterTables | None = None) -> float:
    """Completion time of ``spec`` arriving at t = 0 on the empty cluster, served alone."""
    from hexagent_gym.arrivals import EpisodeWorkload
    from hexagent_gym.simulator import Simulator

    workload = EpisodeWorkload((spec,), np.zeros(1), np.zeros(1, dtype=np.int64))
    sim = Simulator(cluster, workload, decisions=False, compute_horizons=False, tables=tables)
    sim.run_until_decision()
    return sim.workflows[0].finish_t
