"""Speed measurements of the simulator core (``scripts/bench.py`` prints them for docs/)."""

from __future__ import annotations

import gc
import json
import time
from dataclasses import dataclass

import numpy as np

from hexagent_gym.cluster.cluster import load_cluster
from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.planning.cluster_tables import ClusterTables
from hexagent_gym.policy import make_policy, run_policy
from hexagent_gym.sim.horizon import HorizonCache
from hexagent_gym.sim.load import rate_for_load
from hexagent_gym.sim.simulator import Simulator
from hexagent_gym.workload.arrivals import sample_episode
from hexagent_gym.workload.workload import load_trace


@dataclass(frozen=True)
class CoreBench:
    """Wall time per simulated call of the fallback policy (best of ``repeat`` runs)."""

    trace: str
    cluster: str
    num_workflows: int
    num_calls: int
    arrival_rate: float
    us_per_call: float  # horizons cached (the steady state of a training run)
    us_per_call_cold: float  # including every workflow's standalone horizon
    req99: float
    prefix_cache: bool = True
    prefix_hit_rate: float = 0.0


def bench_core(trace: str = "bfcl_v3", cluster: str = "hetero-1", num_workflows: int = 400,
               load: float = 0.8, seed: int = 0, repeat: int = 3,
               prefix_cache: bool = True) -> CoreBench:
    """Run the fallback-only simulator on one episode and time it (``load`` is the no-cache
    prefill utilisation that sets the arrival rate, the same rate with the cache on or off)."""
    spec = load_cluster(cluster)
    tr = load_trace(trace)
    tables = ClusterTables(spec)
    rate = rate_for_load(tables, tr.workflows, load)
    work = sample_episode(tr, num_workflows, np.random.default_rng(seed), rate)
    cold, warm = [], []
    result = None
    for _ in range(repeat):
        horizons = HorizonCache(spec, tables, prefix_cache=prefix_cache)
        t0 = time.perf_counter()
        Simulator(spec, work, decisions=False, tables=tables, horizons=horizons,
                  prefix_cache=prefix_cache).run(close=True)
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        result = Simulator(spec, work, decisions=False, tables=tables, horizons=horizons,
                           prefix_cache=prefix_cache).run(close=True)
        warm.append(time.perf_counter() - t0)
    n = result.num_calls
    return CoreBench(trace, cluster, num_workflows, n, rate, 1e6 * min(warm) / n,
                     1e6 * min(cold) / n, result.req99, prefix_cache, result.prefix_hit_rate)


@dataclass(frozen=True)
class TimelineBench:
    """Wall time per simulated call of one policy's rollout with ``record_timeline`` off and on
    (best of ``repeat`` runs each, horizons cached), and the cost of exporting the trace."""

    policy: str
    trace: str
    cluster: str
    num_workflows: int
    num_calls: int
    us_per_call_off: float
    us_per_call_on: float  # recording, and building EpisodeResult.timeline at the end
    spans: int
    export_ms: float  # Timeline.to_chrome_trace() and json.dumps of it

    @property
    def overhead_pct(self) -> float:
        """How much slower the rollout is with recording on, in percent."""
        return 100.0 * (self.us_per_call_on / self.us_per_call_off - 1.0)


def bench_timeline(policy: str = "hexagent", trace: str = "bfcl_v3", cluster: str = "hetero-1",
                   num_workflows: int = 400, load: float = 0.8, seed: int = 0,
                   repeat: int = 3) -> TimelineBench:
    """Time whole rollouts of ``policy`` with timeline recording off and on, alternating (so
    that drift in the machine's speed hits both alike), after one warm-up rollout that fills the
    standalone-horizon cache they share."""
    factory = EpisodeFactory(EpisodeConfig(cluster=cluster, trace=trace,
                                           num_workflows=num_workflows, load=load, seed=seed))
    run_policy(factory.simulator(), make_policy(policy), close=True)
    best = {False: float("inf"), True: float("inf")}
    result = None
    for _ in range(repeat):
        for record in (False, True):
            sim = factory.simulator(record_timeline=record)
            pick = make_policy(policy)
            gc.collect()  # a full collection inside one short timed rollout would dominate it
            t0 = time.perf_counter()
            result = run_policy(sim, pick, close=True)
            best[record] = min(best[record], time.perf_counter() - t0)
    timeline = result.timeline
    t0 = time.perf_counter()
    json.dumps(timeline.to_chrome_trace())
    export = time.perf_counter() - t0
    n = result.num_calls
    return TimelineBench(policy, trace, cluster, num_workflows, n, 1e6 * best[False] / n,
                         1e6 * best[True] / n, len(timeline), 1e3 * export)
