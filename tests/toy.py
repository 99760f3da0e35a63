"""Tiny hand-computable clusters for core tests (linear latency models, no YAML)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np


@dataclass(frozen=True)
class ToyLatency:
    """prefill = a + b·n; decode step = c + e·batch + f·context (seconds)."""

    a: float = 0.01
    b: float = 1e-4
    c: float = 0.02
    e: float = 1e-3
    f: float = 1e-6
    kv_bytes_per_token: int = 1000

    def prefill_time(self, n: int, cached: int = 0) -> float:
        return self.a + self.b * (n - cached)

    def decode_step_time(self, batch: int, ctx: float) -> float:
        return self.c + self.e * batch + self.f * ctx

    def kv_bytes(self, tokens: int) -> int:
        return tokens * self.kv_bytes_per_token


def toy_cluster(prefill=(ToyLatency(),), decode=(ToyLatency(),), capacity=100_000,
                max_batch=64, setup=0.001, s_per_token=1e-6, name="toy", prefill_kv=0):
    """A duck-typed ClusterSpec: one instance per latency model given (``prefill_kv``: KV tokens
    of each prefill instance, i.e. its prefix cache's default size; 0 = no caching)."""
    pre = tuple(SimpleNamespace(role="prefill", index=i, gpu=f"g{i}", tp=1, latency=lm,
                                kv_capacity_tokens=prefill_kv, max_batch_size=1)
                for i, lm in enumerate(prefill))
    caps = capacity if isinstance(capacity, tuple) else (capacity,) * len(decode)
    dec = tuple(SimpleNamespace(role="decode", index=i, gpu=f"g{i}", tp=1, latency=lm,
                                kv_capacity_tokens=caps[i], max_batch_size=max_batch)
                for i, lm in enumerate(decode))
    P, D = len(pre), len(dec)
    setup_m = np.full((P, D), setup)
    spt_m = np.full((P, D), s_per_token)

    def transfer_time(p, d, tokens):
        return setup_m[p, d] + tokens * spt_m[p, d]

    return SimpleNamespace(name=name, prefill=pre, decode=dec, transfer_setup_s=setup_m,
                           transfer_s_per_token=spt_m, transfer_time=transfer_time,
                           max_decode_kv_tokens=max(caps), source="<toy>")


def workflow_with_reuse(calls, wid="w", block=100):
    """A parsed workflow from ``(input, output, parents, extra_keys)`` tuples, where the extra
    keys are trace fields such as ``prefix_of``/``prefix_tokens`` or ``sample_group``; prompt
    blocks of ``block`` tokens."""
    from hexagent_gym.workload.workload import parse_workflow

    return parse_workflow({
        "workflow_id": wid, "hash_block_tokens": block,
        "calls": [{"id": str(i), "parents": [str(p) for p in parents], "input_tokens": n_in,
                   "output_tokens": n_out, "tool_latency_s": 0.0, **extra}
                  for i, (n_in, n_out, parents, extra) in enumerate(calls)]})


@dataclass(frozen=True)
class FixedPredictor:
    """A length predictor that predicts ``value`` output tokens for every call (a stand-in
    proxy model for hand-computed preemption and timeline cases)."""

    value: int
    name: str = "fixed"

    def predict(self, true, rng):
        return np.full(len(true), self.value, dtype=np.int64)


def toy_episode(*workflows, arrivals=None):
    """An EpisodeWorkload of ``workflows`` (all at t = 0 unless ``arrivals`` are given)."""
    from hexagent_gym.workload.arrivals import EpisodeWorkload

    arrivals = np.zeros(len(workflows)) if arrivals is None else np.asarray(arrivals, float)
    return EpisodeWorkload(tuple(workflows), arrivals, np.arange(len(workflows)))


def tight_memory_simulator():
    """Three twin instances per pool with 3,000 KV tokens each and eight 3-call workflows
    arriving 30 ms apart: decode reservations bind, free calls may move, twins tie exactly."""
    from hexagent_gym.sim.simulator import Simulator
    from hexagent_gym.workload.arrivals import EpisodeWorkload
    from hexagent_gym.workload.workload import make_workflow

    lm = ToyLatency()
    cluster = toy_cluster(prefill=(lm, lm, lm), decode=(lm, lm, lm), capacity=3000)
    rng = np.random.default_rng(7)
    wfs = tuple(make_workflow([(int(rng.integers(300, 900)), int(rng.integers(100, 600)), 0.0,
                                []) for _ in range(3)], f"w{i}") for i in range(8))
    work = EpisodeWorkload(wfs, np.arange(len(wfs)) * 0.03, np.arange(len(wfs)))
    return Simulator(cluster, work, length_predictor="lognormal", rng=rng)
