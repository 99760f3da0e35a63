"""The training pipeline: :func:`train` a :class:`~hexagent_gym.agents.training.config.TrainConfig`
into a :class:`TrainResult` (the steps are listed in the ``hexagent_gym.agents.training``
docstring)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sb3_contrib import MaskablePPO
from stable_baselines3.common.logger import configure
from stable_baselines3.common.utils import set_random_seed
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecMonitor

from hexagent_gym.agents.callbacks import RolloutEvalCallback, rollout_stats
from hexagent_gym.agents.learned import make_model
from hexagent_gym.agents.shaping import ReferenceRelativeReward, relative_env_fn
from hexagent_gym.agents.training.config import TrainConfig, episode_config
from hexagent_gym.agents.training.warmstart import warm_start
from hexagent_gym.config import ConfigError, suggest
from hexagent_gym.envs.mixture import make_mixture_fn
from hexagent_gym.envs.pd_cluster_env import ENV_KEYS, PDClusterEnv, make_env_fn
from hexagent_gym.policy import policy_names


@dataclass(frozen=True)
class TrainResult:
    """Files and figures of one :func:`train` run (run.json holds the same, less ``reward``
    and ``train_rewards``).

    Attributes:
        config: the run's configuration.
        model_path: the final model (``config.model_path``), saved after PPO.
        best_model_path: ``<logdir>/best_model.zip``, the model at the evaluation with the
            lowest Req99 (the first such).
        run_record: ``<logdir>/run.json``.
        history: one row per evaluation, in order: ``timesteps``, the model's
            ``hexagent_gym.agents.callbacks.rollout_stats`` on the evaluation seeds (``req95``,
            ``req99``, ``mean_ratio``, ``scheduler_ms``, ``attainment@<α>``) and ``reward``, the
            mean return of those episodes under the env's reward (never the relative shaping).
            Evaluations run at the start, every ``eval_every`` steps during rollouts and at the
            end unless one ran at the last step; an evaluation during a rollout precedes that
            rollout's PPO update, so the last row is of the saved model only when it was run
            at the end.
        best_req99: the lowest ``req99`` of ``history``.
        best_step: its ``timesteps``.
        reference: ``rollout_stats`` of HexAgent on the same evaluation episodes.
        baselines: ``rollout_stats`` of each of ``config.baselines`` on the same evaluation
            episodes, by name (empty without baselines).
        train_rewards: returns of the last (up to 100) training episodes, under the training
            reward; their mean is TensorBoard's ``rollout/ep_rew_mean``.
        bc: :attr:`hexagent_gym.agents.training.WarmStart.stats`, empty without a warm start.
        timings: seconds: ``bc_collect_s`` and ``bc_total_s`` with a warm start, ``ppo_s``.
    """

    config: TrainConfig
    model_path: Path
    best_model_path: Path
    run_record: Path
    history: tuple[dict[str, float], ...]
    best_req99: float
    best_step: int
    reference: dict[str, float]
    baselines: dict[str, dict[str, float]]
    train_rewards: tuple[float, ...]
    bc: dict[str, float]
    timings: dict[str, float]

    @property
    def final_eval(self) -> dict[str, float]:
        """The last row of ``history``."""
        return self.history[-1]

    @property
    def req95(self) -> float:
        return self.final_eval["req95"]

    @property
    def req99(self) -> float:
        return self.final_eval["req99"]

    @property
    def eval_reward(self) -> float:
        return self.final_eval["reward"]

    def summary(self) -> str:
        """One line: the final model, PPO time, final and best evaluation Req99."""
        return (f"saved {self.model_path} ({self.timings['ppo_s']:.0f} s of PPO; eval req99 "
                f"{self.req99}, best {self.best_req99:.3f} at step {self.best_step}, best model "
                f"{self.best_model_path})")


class _Evaluations(RolloutEvalCallback):
    """RolloutEvalCallback that also keeps each evaluation's mean return, hands every new
    evaluation row to ``on_eval`` and evaluates the ``baselines`` policies once on the same
    episodes, logging them at every evaluation as ``baseline/<name>/<metric>``."""

    def __init__(self, eval_env: Any, on_eval: Callable[[dict[str, float]], None] | None,
                 baselines: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(eval_env, **kwargs)
        self.on_eval = on_eval
        self.baselines = tuple(baselines)
        self.baseline_stats: dict[str, dict[str, float]] = {}
        self.rewards: list[float] = []
        self.rows: list[dict[str, float]] = []

    def evaluate_model(self) -> tuple[dict[str, float], np.ndarray]:
        # RolloutEvalCallback.evaluate_model's rollouts, keeping the returns it drops
        results = [self.eval_env.rollout(self.model, seed=s, deterministic=True)
                   for s in self.seeds]
        self.rewards.append(float(np.mean([r.total_reward for r in results])))
        return rollout_stats(results, self.alphas), np.concatenate([r.ratios for r in results])

    def _publish(self) -> None:
        while len(self.rows) < len(self.history):
            i = len(self.rows)
            self.rows.append({**self.history[i], "reward": self.rewards[i]})
            if self.on_eval is not None:
                self.on_eval(self.rows[-1])

    def _on_training_start(self) -> None:
        # before the first evaluation, so that its line reads against them
        for name in self.baselines:
            stats = rollout_stats([self.eval_env.rollout(name, seed=s) for s in self.seeds],
                                  self.alphas)
            self.baseline_stats[name] = stats
            if self.verbose:
                print(f"[baseline] {name}: req99 {stats['req99']:.3f}, req95 "
                      f"{stats['req95']:.3f}, mean {stats['mean_ratio']:.3f} (the evaluation "
                      f"episodes)", flush=True)
        super()._on_training_start()
        self._publish()

    def _evaluate(self) -> None:
        # recorded before the evaluation's own logger.dump writes them at its step: constant
        # lines beside eval/req99 in TensorBoard, as hexagent/req99 is
        for name, stats in self.baseline_stats.items():
            for key, value in stats.items():
                self.logger.record(f"baseline/{name}/{key}", value)
        super()._evaluate()

    def _on_step(self) -> bool:
        keep_going = super()._on_step()
        self._publish()
        return keep_going

    def _on_training_end(self) -> None:
        super()._on_training_end()
        self._publish()


def _env_fn(config: TrainConfig, episodes: Any, overrides: dict[str, Any],
            rank: int) -> Callable[[], Any]:
    """The thunk of one training (or teacher) env: on the mixture when the config names one
    (its settings bring their own episodes, so only the env options apply), else on
    ``episodes`` with ``overrides``."""
    if config.mixture is None:
        return make_env_fn(episodes, rank=rank, **overrides)
    options = {k: v for k, v in overrides.items() if k in ENV_KEYS}
    return make_mixture_fn(config.mixture, rank=rank, seed=config.seed, **options)


def _make_envs(config: TrainConfig, episodes: Any, overrides: dict[str, Any],
               shaping: dict[str, Any]) -> tuple[Any, Any]:
    """(the monitored training vector env, the evaluation env)."""
    fns = [_env_fn(config, episodes, overrides, i) for i in range(config.n_envs)]
    if shaping:
        fns = [relative_env_fn(fn, **shaping) for fn in fns]
    eval_over = dict(overrides)
    if config.eval_num_workflows:
        eval_over["num_workflows"] = config.eval_num_workflows
    eval_env = PDClusterEnv(episodes, **eval_over)  # first: a config error costs no processes
    vec = VecMonitor(SubprocVecEnv(fns) if config.vec == "subproc" else DummyVecEnv(fns))
    return vec, eval_env


def _make_model(config: TrainConfig, vec: Any) -> Any:
    ppo_kwargs = dict(learning_rate=config.lr, n_steps=config.n_steps,
                      batch_size=config.batch_size, n_epochs=config.n_epochs, gamma=config.gamma,
                      gae_lambda=config.gae_lambda, clip_range=config.clip_range,
                      ent_coef=config.ent_coef)
    if config.load_model:
        # models saved before an observation key existed (e.g. `cached`) load against today's
        # space; the network reads only the keys it was built for
        return MaskablePPO.load(config.load_model, env=vec, device="cpu",
                                custom_objects={"observation_space": vec.observation_space},
                                **ppo_kwargs)
    policy_kwargs = None
    if config.policy == "equivariant":
        policy_kwargs = {"hidden": config.hidden, "prior": config.prior}
        if config.cache_feature:
            policy_kwargs["cache_feature"] = True
    return make_model(vec, config.policy, policy_kwargs=policy_kwargs, device="cpu", verbose=0,
                      **ppo_kwargs)


def train(config: TrainConfig,
          on_eval: Callable[[dict[str, float]], None] | None = None) -> TrainResult:
    """Run the whole training pipeline of ``config`` (module docstring) and return its result.

    ``on_eval(row)`` is called with each :attr:`TrainResult.history` row as soon as that
    evaluation has run (live reporting, e.g. to Ray Tune). Sets torch's thread count to
    ``config.threads`` for the process.

    Raises:
        hexagent_gym.config.ConfigError: the episodes cannot be built (e.g. an unknown cluster,
            trace or reward) or a baseline is no registered policy; raised before anything is
            written.
    """
    known = policy_names()
    for name in config.baselines:
        if name.lower() not in known:
            raise ConfigError(f"unknown baseline policy '{name}'; known: {', '.join(known)}."
                              f"{suggest(name.lower(), known)}")
    torch.set_num_threads(config.threads)
    set_random_seed(config.seed)
    episodes, overrides = episode_config(config)
    shaping: dict[str, Any] = {}
    if config.relative_to != "none":
        shaping = {"reference": config.relative_to}
        if config.terminal_weight is not None:
            shaping["terminal_weight"] = config.terminal_weight
    vec, eval_env = _make_envs(config, episodes, overrides, shaping)
    config.logdir.mkdir(parents=True, exist_ok=True)
    logger = configure(str(config.logdir),
                       ["tensorboard", "csv"] + (["stdout"] if config.verbose >= 2 else []))
    model = _make_model(config, vec)
    model.set_logger(logger)

    timings: dict[str, float] = {}
    bc: dict[str, float] = {}
    if config.init_from != "none":
        demo_env = _env_fn(config, episodes, overrides, rank=0)()
        if shaping:
            demo_env = ReferenceRelativeReward(demo_env, **shaping)
        done = warm_start(model, demo_env, teacher=config.init_from, episodes=config.bc_episodes,
                          epochs=config.bc_epochs, lr=config.bc_lr,
                          value_coef=config.bc_value_coef, dagger_rounds=config.dagger_rounds,
                          dagger_episodes=config.dagger_episodes,
                          target_prob=config.bc_target_prob, gamma=config.gamma,
                          seed=config.seed, logger=logger, verbose=config.verbose,
                          cache=config.demos)
        timings.update(bc_collect_s=done.collect_s, bc_total_s=done.total_s)
        bc = done.stats

    best_model_path = config.logdir / "best_model.zip"
    evals = _Evaluations(
        eval_env, on_eval, baselines=config.baselines, eval_every=config.eval_every,
        seeds=config.eval_seeds,
        hparams={"env_cluster": eval_env.config.cluster, "env_trace": eval_env.config.trace,
                 "num_workflows": eval_env.config.num_workflows,
                 "load": overrides.get("load", eval_env.config.load),
                 "init_from": config.init_from, "policy_arch": config.policy,
                 "mixture": str(config.mixture),
                 "total_timesteps": config.total_timesteps,
                 "relative_to": config.relative_to, "reward": config.reward},
        best_model_path=best_model_path, verbose=config.verbose)
    start = time.perf_counter()
    model.learn(config.total_timesteps, callback=evals,
                reset_num_timesteps=config.load_model is None)
    timings["ppo_s"] = time.perf_counter() - start
    config.model_path.parent.mkdir(parents=True, exist_ok=True)
    model.save(config.model_path)
    train_rewards = tuple(float(ep["r"]) for ep in model.ep_info_buffer)
    vec.close()

    run_record = config.logdir / "run.json"
    record = {"args": config.to_dict(), "config": episodes, "overrides": overrides,
              "timings": timings, "bc": bc, "final_eval": evals.history[-1],
              "best_eval_req99": evals.best_req99, "best_step": evals.best_step,
              "reference": evals.reference_stats, "baselines": evals.baseline_stats,
              "history": evals.history}
    run_record.write_text(json.dumps(record, indent=1, default=str) + "\n")
    return TrainResult(config=config, model_path=config.model_path,
                       best_model_path=best_model_path, run_record=run_record,
                       history=tuple(evals.rows), best_req99=evals.best_req99,
                       best_step=evals.best_step, reference=evals.reference_stats,
                       baselines=evals.baseline_stats,
                       train_rewards=train_rewards, bc=bc, timings=timings)


__all__ = ["TrainResult", "train"]
