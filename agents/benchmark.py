"""Scheduler overhead of a policy (wall time per invocation on one episode), the cost of
workflow-horizon forecasts in a HexAgent rollout, and PPO training throughput (``learn()``
steps/s next to CartPole-v1 in the same run)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch as th
from stable_baselines3.common.callbacks import BaseCallback

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
    result = run_policy(sim, pol, close=True)
    ms = 1e3 * result.invocation_seconds
    return PolicyBench(policy, result.invocations, float(ms.mean()), float(np.median(ms)),
                       float(np.percentile(ms, 99)), result.scheduler_seconds, result.req99,
                       result.decisions / max(result.invocations, 1))


@dataclass(frozen=True)
class HorizonBench:
    """What forecasting horizons adds to a HexAgent rollout (the fastest of ``repeat`` each).

    Both timed rollouts run ``hexagent`` on the same episode, which ignores the forecasts, so
    they make the same decisions and differ only by the predictor's work (features, batched
    predictions, online refits). The warm start is a one-time cost per setting, reported apart.
    """

    predictor: str
    num_calls: int
    seconds_without: float  # the rollout with no predictor
    seconds_with: float  # the same rollout forecasting every shown workflow's horizon
    warm_start_seconds: float  # fitting on the train half's episodes, once per factory
    req99_hexagent: float
    req99_horizon: float  # hexagent-horizon on the same episode, for reference

    @property
    def overhead_pct(self) -> float:
        return 100.0 * (self.seconds_with / self.seconds_without - 1.0)


def bench_horizon(predictor: str = "learned", cluster: str = "hetero-1",
                  trace: str = "bfcl_v3", num_workflows: int = 400, arrival_rate: float = 40.0,
                  warm_start: int = 2, seed: int = 0, repeat: int = 3) -> HorizonBench:
    """Time a HexAgent rollout with and without ``predictor`` (the paper's loaded rate)."""
    base = EpisodeConfig(cluster=cluster, trace=trace, num_workflows=num_workflows,
                         arrival_rate=arrival_rate, load=None, workflow_split="eval")
    plain = EpisodeFactory(base)
    forecast = EpisodeFactory(base.replace(
        horizon_predictor=predictor,
        horizon_warm_start=warm_start if predictor in ("app-mean", "learned") else 0))
    t0 = time.perf_counter()
    forecast.horizon_predictor()  # the warm start, once
    warm = time.perf_counter() - t0
    plain.simulator(seed).run()  # fill the standalone-horizon caches before timing
    forecast.simulator(seed).run()
    best = {"without": float("inf"), "with": float("inf")}
    result = None
    for _ in range(repeat):
        for label, factory in (("without", plain), ("with", forecast)):
            sim = factory.simulator(seed)
            t0 = time.perf_counter()
            result = run_policy(sim, make_policy("hexagent"))
            best[label] = min(best[label], time.perf_counter() - t0)
    horizon = run_policy(forecast.simulator(seed), make_policy("hexagent-horizon"))
    return HorizonBench(predictor, result.num_calls, best["without"], best["with"], warm,
                        result.req99, horizon.req99)


@dataclass(frozen=True)
class PPORun:
    """Wall time of one timed MaskablePPO / PPO ``learn()`` (the fastest of ``repeat``)."""

    label: str  # "equivariant", "mlp" (MultiInputPolicy) or "cartpole" (plain PPO, MlpPolicy)
    timesteps: int  # env steps collected in the timed learn()
    seconds: float  # wall time of the timed learn()
    rollout_seconds: float  # collecting rollouts: env steps + policy forward (+ GAE)
    update_seconds: float  # the PPO update: n_epochs of minibatch forward/backward

    @property
    def fps(self) -> float:
        return self.timesteps / self.seconds

    @property
    def other_seconds(self) -> float:
        """Neither collection nor update: learn()'s set-up and bookkeeping."""
        return self.seconds - self.rollout_seconds - self.update_seconds


@dataclass(frozen=True)
class PPOBench:
    """PPO training throughput on PDClusterEnv (equivariant and MultiInput policies) next to
    SB3 PPO on CartPole-v1, timed in the same run with the same PPO settings."""

    cluster: str
    trace: str
    num_workflows: int
    n_envs: int
    n_steps: int
    runs: tuple[PPORun, ...]

    def run(self, label: str) -> PPORun:
        return next(r for r in self.runs if r.label == label)

    def ratio(self, label: str, to: str = "cartpole") -> float:
        """fps of ``label`` over fps of ``to``."""
        return self.run(label).fps / self.run(to).fps


class _PhaseTimer(BaseCallback):
    """Sums the wall time of rollout collection (rollout start → end) and of the update (rollout
    end → next rollout start, or the end of learn())."""

    def __init__(self) -> None:
        super().__init__()
        self.rollout = self.update = 0.0
        self._mark: float | None = None
        self._updating = False

    def _close_update(self, now: float) -> None:
        if self._updating and self._mark is not None:
            self.update += now - self._mark
        self._updating = False

    def _on_rollout_start(self) -> None:
        now = time.perf_counter()
        self._close_update(now)
        self._mark = now

    def _on_rollout_end(self) -> None:
        now = time.perf_counter()
        self.rollout += now - self._mark
        self._mark, self._updating = now, True

    def _on_training_end(self) -> None:
        self._close_update(time.perf_counter())

    def _on_step(self) -> bool:
        return True


def _time_learn(model: Any, timesteps: int) -> tuple[float, float, float]:
    """(wall, rollout, update) seconds of ``model.learn(timesteps)`` continuing from its state."""
    timer = _PhaseTimer()
    t0 = time.perf_counter()
    model.learn(timesteps, callback=timer, reset_num_timesteps=False)
    return time.perf_counter() - t0, timer.rollout, timer.update


def _ppo_model(label: str, cluster: str, trace: str, num_workflows: int, load: float,
               n_envs: int, seed: int, ppo_kwargs: dict[str, Any]) -> Any:
    from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor

    if label == "cartpole":
        from stable_baselines3 import PPO

        vec = VecMonitor(DummyVecEnv([lambda: gym.make("CartPole-v1")] * n_envs))
        return PPO("MlpPolicy", vec, seed=seed, device="cpu", verbose=0, **ppo_kwargs)
    from hexagent_gym.agents.equivariant_policy import make_model
    from hexagent_gym.envs.pd_cluster_env import make_env_fn

    fns = [make_env_fn(cluster=cluster, trace=trace, num_workflows=num_workflows, load=load,
                       seed=seed, rank=i) for i in range(n_envs)]
    vec = VecMonitor(DummyVecEnv(fns))
    return make_model(vec, label, seed=seed, device="cpu", verbose=0, **ppo_kwargs)


PPO_LABELS = ("equivariant", "mlp", "cartpole")


def bench_ppo(cluster: str = "hetero-1", trace: str = "bfcl_v3", num_workflows: int = 100,
              load: float = 1.0, n_envs: int = 2, n_steps: int = 512, batch_size: int = 256,
              n_epochs: int = 4, timesteps: int = 2048, repeat: int = 3, seed: int = 0,
              labels: tuple[str, ...] = PPO_LABELS) -> PPOBench:
    """Time MaskablePPO ``learn()`` on PDClusterEnv and SB3 PPO on CartPole-v1.

    For each of ``labels`` ("equivariant":
    :class:`~hexagent_gym.agents.equivariant_policy.EquivariantPolicy`, "mlp": sb3-contrib's
    ``MultiInputPolicy``, "cartpole": PPO ``MlpPolicy`` on CartPole-v1) one model on ``n_envs``
    envs in a ``VecMonitor(DummyVecEnv)`` (as ``scripts/train.py`` builds them; the defaults are
    its episodes, envs, n_steps, batch size and epochs; the other PPO hyperparameters are SB3's and
    do not change the cost) learns one warm-up rollout and update, then ``timesteps`` steps are
    timed, ``repeat`` times; the fastest counts. The timed wall time is split into rollout
    collection and the PPO update. Torch runs on one thread (the training default); the previous
    thread count is restored afterwards.
    """
    ppo_kwargs = dict(n_steps=n_steps, batch_size=batch_size, n_epochs=n_epochs)
    threads = th.get_num_threads()
    th.set_num_threads(1)
    runs = []
    try:
        for label in labels:
            model = _ppo_model(label, cluster, trace, num_workflows, load, n_envs, seed,
                               ppo_kwargs)
            model.learn(n_steps * n_envs)  # warm-up: first reset, one rollout and update
            best = None
            for _ in range(repeat):
                start = model.num_timesteps
                wall, rollout, update = _time_learn(model, timesteps)
                run = PPORun(label, model.num_timesteps - start, wall, rollout, update)
                if best is None or run.fps > best.fps:
                    best = run
            runs.append(best)
    finally:
        th.set_num_threads(threads)
    return PPOBench(cluster, trace, num_workflows, n_envs, n_steps, tuple(runs))
