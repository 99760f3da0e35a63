"""Speed measurements of the simulator core (``scripts/bench.py`` prints them for docs/)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from hexagent_gym.arrivals import sample_episode
from hexagent_gym.cluster import load_cluster
from hexagent_gym.horizon import HorizonCache
from hexagent_gym.load import rate_for_load
from hexagent_gym.planner import ClusterTables
from hexagent_gym.simulator import Simulator
from hexagent_gym.workload import load_trace


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
                  prefix_cache=prefix_cache).run()
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        result = Simulator(spec, work, decisions=False, tables=tables, horizons=horizons,
                           prefix_cache=prefix_cache).run()
        warm.append(time.perf_counter() - t0)
    n = result.num_calls
    return CoreBench(trace, cluster, num_workflows, n, rate, 1e6 * min(warm) / n,
                     1e6 * min(cold) / n, result.req99, prefix_cache, result.prefix_hit_rate)
