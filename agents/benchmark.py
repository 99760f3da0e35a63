"""Scheduler overhead of a policy: wall time per invocation on one episode."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.policy import make_policy, run_policy


@dataclass(frozen=True)
class PolicyBench:
    """Wall time a policy spends per scheduling invocation (projections + picks)."""

    policy: str
    invocations: int
    ms_mean: float
    ms_median: float
    ms_p99: float
    scheduler_seconds: float
    req99: float
    mean_window: float  # waiting calls per invocation


def bench_policy(policy: str = "hexagent", trace: str = "bfcl_v3", cluster: str = "hetero-1",
                 num_workflows: int = 400, load: float = 1.0, seed: int = 0) -> PolicyBench:
    """Run ``policy`` on one episode and report its per-invocation overhead."""
    factory = EpisodeFactory(EpisodeConfig(cluster=cluster, trace=trace,
                                           num_workflows=num_workflows, load=load, seed=seed))
    sim = factory.simulator()
    pol = make_policy(policy)
    result = run_policy(sim, pol)
    ms = 1e3 * result.invocation_seconds
    return PolicyBench(policy, result.invocations, float(ms.mean()), float(np.median(ms)),
                       float(np.percentile(ms, 99)), result.scheduler_seconds, result.req99,
                       result.decisions / max(result.invocations, 1))
