"""Offered load: how busy an arrival rate keeps the prefill pool.

Our traces' prompts are several times longer than the paper's, so its arrival rates would swamp
the simulated clusters. Experiments therefore state their load as a prefill utilisation ρ:

    ρ = λ · E_w[ Σ_{c ∈ w} 1 / Σ_p (1 / prefill_p(c)) ]

i.e. arrivals per second times the pool-seconds a workflow needs when every prefill instance
works on it in parallel at its own speed. ρ = 1 saturates the prefill pool (decode is rarely the
bottleneck for these traces; see docs/simulator.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hexagent_gym.planning.cluster_tables import ClusterTables
    from hexagent_gym.workload.workload import WorkflowSpec


def pool_seconds(tables: ClusterTables, workflow: WorkflowSpec) -> float:
    """Prefill-pool seconds one workflow needs (all instances in parallel at their speeds)."""
    total = 0.0
    for c in workflow.calls:
        times, _ = tables.prefill_times(c.input_tokens)
        total += 1.0 / sum(1.0 / t for t in times)
    return total


def mean_pool_seconds(tables: ClusterTables, workflows: Iterable[WorkflowSpec]) -> float:
    values = [pool_seconds(tables, w) for w in workflows]
    if not values:
        raise ValueError("no workflows to measure the load of")
    return sum(values) / len(values)


def offered_load(tables: ClusterTables, workflows: Iterable[WorkflowSpec], rate: float) -> float:
    """Prefill utilisation ρ of Poisson arrivals at ``rate`` workflows/s."""
    return rate * mean_pool_seconds(tables, workflows)


def rate_for_load(tables: ClusterTables, workflows: Iterable[WorkflowSpec], load: float) -> float:
    """The arrival rate (workflows/s) giving prefill utilisation ``load``."""
    if not load > 0.0:
        raise ValueError(f"load (prefill utilisation) must be > 0, got {load}")
    return load / mean_pool_seconds(tables, workflows)
