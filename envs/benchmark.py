"""Env speed: ``step``/s with a random valid policy, next to CartPole-v1 in the same run, and
the cost per simulated call of whole rollouts as the cluster and the episode grow.

``scripts/bench.py`` prints both (never asserted: CI machines are noisy).
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from hexagent_gym.envs.pd_cluster_env import PDClusterEnv


@dataclass(frozen=True)
class EnvBench:
    """Steps per second of PDClusterEnv and CartPole-v1 (best of ``repeat`` timed runs)."""

    cluster: str
    trace: str
    num_workflows: int
    k: int
    steps: int  # env steps per timed run
    episodes: int  # episodes started per timed run (resets included in the timing)
    steps_per_s: float
    cartpole_steps_per_s: float
    decisions: int = 0  # decision points opened per timed run
    # the garbage collector's share of the env's timed runs (all of them, not only the fastest:
    # a full collection lands in one run of several; the user's loop pays it too)
    gc_share: float = 0.0

    @property
    def picks_per_decision(self) -> float:
        """Steps per decision point: a step's cost is mostly its decision point's when low."""
        return self.steps / self.decisions if self.decisions else float("nan")

    @property
    def us_per_step(self) -> float:
        return 1e6 / self.steps_per_s


def random_valid_steps(env: PDClusterEnv, steps: int, rng: np.random.Generator,
                       seed: int = 0) -> tuple[int, int]:
    """Step ``env`` with uniformly random valid actions for ``steps`` steps (resetting at episode
    ends); returns (episodes started, decision points opened).

    The uniforms come from one draw of ``steps`` floats up front (a valid action is
    ``valid[int(u * len(valid))]``), so the loop times the env, not a generator call per step."""
    env.reset(seed=seed)
    episodes, decisions = 1, 0
    for u in rng.random(steps).tolist():
        valid = env.action_masks().nonzero()[0]  # the mask is 1-D: np.flatnonzero's result
        _, _, terminated, truncated, _ = env.step(valid[int(u * len(valid))])
        if terminated or truncated:
            decisions += env.simulator.invocations
            env.reset()
            episodes += 1
    return episodes, decisions + env.simulator.invocations


def bench_cartpole(steps: int, rng: np.random.Generator) -> float:
    """Steps per second of the raw CartPole-v1 env with random actions (drawn up front, as
    :func:`random_valid_steps` draws them)."""
    env = gym.make("CartPole-v1").unwrapped
    env.reset(seed=0)
    actions = rng.integers(2, size=steps).tolist()
    t0 = time.perf_counter()
    for a in actions:
        _, _, terminated, truncated, _ = env.step(a)
        if terminated or truncated:
            env.reset()
    return steps / (time.perf_counter() - t0)


def bench_env(cluster: str = "hetero-1", trace: str = "bfcl_v3", num_workflows: int = 400,
              steps: int = 20_000, repeat: int = 3, seed: int = 0, **overrides) -> EnvBench:
    """Time PDClusterEnv (raw env, random valid actions from ``action_masks``) and CartPole-v1.

    Before timing, the horizon cache is filled for the whole trace and one warm-up episode
    runs: a training run's steady state (a cold cache would add every workflow's first
    standalone replay to the steps that reveal it).
    """
    if repeat < 1 or steps < 1:
        raise ValueError(f"bench_env needs steps >= 1 and repeat >= 1 timed runs, got steps="
                         f"{steps}, repeat={repeat}")
    env = PDClusterEnv(cluster=cluster, trace=trace, num_workflows=num_workflows, seed=seed,
                       **overrides)
    rng = np.random.default_rng(seed)
    env.factory.fill_horizons()
    env.reset(seed=seed)
    while True:  # warm-up episode
        valid = np.flatnonzero(env.action_masks())
        if env.step(valid[rng.integers(len(valid))])[2]:
            break
    best, cart, episodes, timed, collecting = 0.0, 0.0, 0, 0.0, 0.0
    clock = _CollectorClock()
    gc.callbacks.append(clock)
    try:
        for _ in range(repeat):  # interleaved with CartPole: both see the same machine moments
            clock.seconds = 0.0
            t0 = time.perf_counter()
            episodes, decisions = random_valid_steps(env, steps, rng, seed)
            elapsed = time.perf_counter() - t0
            timed, collecting = timed + elapsed, collecting + clock.seconds
            best = max(best, steps / elapsed)
            cart = max(cart, bench_cartpole(steps, rng))
    finally:
        gc.callbacks.remove(clock)
    return EnvBench(cluster, trace, num_workflows, env.k, steps, episodes, best, cart, decisions,
                    collecting / timed)


SCALING_ROWS = (("hetero-1", 400), ("hetero-1-x2", 800), ("hetero-1-x4", 1600),
                ("hetero-1-x8", 3200), ("hetero-1", 10_000))
"""(cluster, workflows) of the scaling table: hetero-1's mix at 1x/2x/4x/8x the size with the
workflows scaled alike (same load), then a 25x longer episode on the base cluster."""


@dataclass(frozen=True)
class ScalingRow:
    """Wall time of ``env.rollout(policy)`` per simulated call on one (cluster, episode size)."""

    cluster: str
    instances: str  # "8P+8D"
    num_workflows: int
    num_calls: int
    us_per_call_first: float  # first rollout of a fresh env: includes every standalone horizon
    us_per_call: float  # fastest later sample, horizons cached (a training or evaluation loop);
    # a sample is ``laps`` rollouts back to back (about as many calls as the longest row's)
    ms_per_invocation: float  # the policy's planning time per scheduling invocation (second)
    req99: float
    # picks per simulated call: every invocation re-plans every call still waiting, so this grows
    # with the cluster (more calls wait cluster-wide when an invocation fires)
    picks_per_call: float = 0.0
    laps: int = 1  # rollouts per timed sample
    # of us_per_call, the garbage collector's time in that sample (its collections traverse
    # everything the process holds: here every row's env, so its share is an upper bound of
    # what a process holding one env pays)
    gc_us_per_call: float = 0.0
    # every timed sample's µs per call, round by round (``us_per_call`` is their minimum); rows
    # of one table share the rounds, so :func:`paired_ratios` compares samples seconds apart
    samples: tuple[float, ...] = ()


def paired_ratios(num: ScalingRow, den: ScalingRow) -> list[float]:
    """``num``'s cost per call over ``den``'s, round by round: each round times every row once,
    so its two samples are seconds apart and a slow stretch of the machine that starts between
    rounds weighs on both (the ratio of the fastest samples can pair one row's sample from
    before such a stretch with another's from inside it). Raises ValueError unless both rows
    come from the same table (the same number of rounds, at least one)."""
    if not num.samples or len(num.samples) != len(den.samples):
        raise ValueError(f"paired_ratios needs rows of one bench_scaling table, got "
                         f"{len(num.samples)} and {len(den.samples)} samples")
    return [a / b for a, b in zip(num.samples, den.samples, strict=True)]


def bench_scaling(policy: str = "hexagent", trace: str = "bfcl_v3", load: float = 1.0,
                  rows: tuple[tuple[str, int], ...] = SCALING_ROWS,
                  seed: int = 0, repeat: int = 3) -> list[ScalingRow]:
    """Roll out ``policy`` per (cluster, workflows) row through the public API: once on a
    fresh env (standalone horizons included), then ``repeat`` timed samples with the horizons
    cached, each after a full garbage collection, keeping the fastest sample per row (and
    every sample, ``ScalingRow.samples``, for :func:`paired_ratios`).

    Every sample spans about the same number of simulated calls: a row whose episode is
    shorter than the longest row's rolls its episode out back to back until it has simulated
    at least as many calls (400 workflows: 26 rollouts against one of 10,000). The fastest of
    a few 0.1-second windows is a luckier draw on a noisy machine than the fastest of a few
    3-second ones, so equal windows keep the rows' ratios about the code, not the draw.

    The samples go round the rows (every row once, then again), so the rows' ratios compare
    samples timed minutes apart at most rather than a whole table apart: this machine's speed
    drifts by a third within minutes. Each row also reports the garbage collector's time in its
    fastest sample (``gc.callbacks``)."""
    envs, first, episode_calls, facts = [], [], [], []
    for cluster, n in rows:
        env = PDClusterEnv(cluster=cluster, trace=trace, num_workflows=n, load=load, seed=seed)
        t0 = time.perf_counter()
        result = env.rollout(policy)
        first.append(time.perf_counter() - t0)
        envs.append(env)
        episode_calls.append(result.num_calls)
        del result
    window = max(episode_calls)
    laps = [-(-window // max(calls, 1)) for calls in episode_calls]  # rollouts per sample
    again = [math.inf] * len(rows)
    samples: list[list[float]] = [[] for _ in rows]  # every sample, round by round
    collecting = [0.0] * len(rows)  # the collector's seconds per rollout in the fastest sample
    clock = _CollectorClock()
    gc.callbacks.append(clock)
    try:
        for rep in range(max(repeat, 1)):
            for i, env in enumerate(envs):
                gc.collect()
                clock.seconds = 0.0
                t0 = time.perf_counter()
                for _ in range(laps[i]):
                    result = None  # the last lap's result is not kept alive through this one
                    result = env.rollout(policy)
                sample = (time.perf_counter() - t0) / laps[i]
                samples[i].append(sample)
                if sample < again[i]:
                    again[i], collecting[i] = sample, clock.seconds / laps[i]
                if rep == 0:  # the row's figures (every rollout of a row is the same episode);
                    # only these are kept, so the other rows' results do not weigh on collections
                    facts.append((result.num_calls, result.scheduler_seconds / max(
                        result.invocations, 1), result.req99, result.decisions))
                del result
    finally:
        gc.callbacks.remove(clock)
    out = []
    for (cluster, n), env, fact, t_first, t_again, lap, t_gc, timed in zip(
            rows, envs, facts, first, again, laps, collecting, samples, strict=True):
        calls, per_invocation, req99, decisions = fact
        spec = env.factory.cluster
        out.append(ScalingRow(cluster, f"{len(spec.prefill)}P+{len(spec.decode)}D", n, calls,
                              1e6 * t_first / calls, 1e6 * t_again / calls,
                              1e3 * per_invocation, req99, decisions / calls, lap,
                              1e6 * t_gc / calls, tuple(1e6 * t / calls for t in timed)))
    return out


class _CollectorClock:
    """A ``gc.callbacks`` hook adding up the wall time of the collections since ``seconds``
    was last reset."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
