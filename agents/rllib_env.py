"""PDCluster-v0 in the shape an action-masking RLModule reads, its registration, and the PPO
config on RLlib's new API stack.

:class:`hexagent_gym.agents.rllib_module.MaskedPPOTorchRLModule` (our module on RLlib's public
``DefaultPPOTorchRLModule``; RLlib's own masking module is an example that imports a deprecated
alias) wants a ``Dict`` observation with exactly two keys: ``"action_mask"``, a float
``Box(0, 1, (n,))`` whose zeros set the logits to ``FLOAT_MIN``, and ``"observations"``, what the
default encoder reads (a flat ``Box`` gets an MLP). :class:`RLlibObservation` makes that from the
env built with ``action_mask_in_obs=True``: it concatenates every other key (in the observation
space's key order) into ``"observations"`` and passes the mask through as float32. Nothing else
changes: rewards, episode ends and the info (``req99`` etc. on the final step) are the env's.
:func:`result_scalars` picks the TensorBoard scalars out of an ``Algorithm.train()`` result.

The wrapper needs only gymnasium; ray is imported inside :func:`register_rllib_env` and
:func:`ppo_config` alone, so importing this module never imports ray.
``pip install "hexagent-gym[distributed]"`` brings ``ray[rllib]``; note that it pins gymnasium
exactly (ray 2.60: gymnasium 1.2.2).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

import hexagent_gym

RLLIB_ENV_NAME = "hexagent-pdcluster"
MASK_KEY, OBS_KEY = "action_mask", "observations"


class RLlibObservation(gym.ObservationWrapper):
    """``{"action_mask": Box(0, 1, (n,), float32), "observations": Box((F,), float32)}``.

    ``env`` must be a PDCluster env made with ``action_mask_in_obs=True`` (otherwise a
    ``ValueError`` says so). ``observations`` is the concatenation of the other keys, each
    flattened C-order, in the order of ``env.observation_space`` (sorted key names); its bounds
    are the boxes' own, so every observation is contained in the space. ``keys`` and
    ``slices`` say where each key landed. The mask equals ``env.unwrapped.action_masks()``.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, spaces.Dict) or MASK_KEY not in space.spaces:
            raise ValueError("RLlibObservation needs the action mask inside the observation: "
                             "build the env with action_mask_in_obs=True "
                             "(hexagent_gym.make(..., action_mask_in_obs=True))")
        self.keys = tuple(k for k in space.spaces if k != MASK_KEY)
        sizes = [int(np.prod(space[k].shape)) for k in self.keys]
        ends = np.cumsum(sizes)
        self.slices = {k: slice(int(e - n), int(e)) for k, n, e in zip(self.keys, sizes, ends,
                                                                        strict=True)}
        low = np.concatenate([np.broadcast_to(space[k].low, space[k].shape).ravel()
                              for k in self.keys]).astype(np.float32)
        high = np.concatenate([np.broadcast_to(space[k].high, space[k].shape).ravel()
                               for k in self.keys]).astype(np.float32)
        n = int(env.action_space.n)
        self.observation_space = spaces.Dict({
            MASK_KEY: spaces.Box(0.0, 1.0, (n,), np.float32),
            OBS_KEY: spaces.Box(low, high, dtype=np.float32),
        })

    def observation(self, observation: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        flat = np.concatenate([np.asarray(observation[k], np.float32).ravel()
                               for k in self.keys])
        return {MASK_KEY: np.asarray(observation[MASK_KEY], np.float32), OBS_KEY: flat}


def make_rllib_env(env_config: Mapping[str, Any] | None = None) -> RLlibObservation:
    """RLlib env creator: ``env_config`` holds ``hexagent_gym.make`` keyword arguments (e.g.
    ``{"cluster": "hetero-1", "num_workflows": 100}``; a ``"config"`` key names an experiment
    YAML). RLlib passes an ``EnvContext``; its ``worker_index`` offsets the config seed of the
    first unseeded reset, so env runners sample different episodes (set
    ``config.debugging(seed=...)`` to seed the resets themselves)."""
    kwargs = dict(env_config or {})
    kwargs.pop("action_mask_in_obs", None)  # always on: the RLModule reads the mask from obs
    config = kwargs.pop("config", None)
    env = hexagent_gym.make(config, action_mask_in_obs=True, **kwargs)
    env.unwrapped.default_seed += int(getattr(env_config, "worker_index", 0))
    return RLlibObservation(env)


def register_rllib_env(name: str = RLLIB_ENV_NAME) -> str:
    """Register :func:`make_rllib_env` with Ray Tune under ``name`` (for
    ``PPOConfig().environment(name, env_config={...})``) and return the name. Call it in the
    driver; RLlib ships the creator to its env runners."""
    from ray.tune.registry import register_env

    register_env(name, make_rllib_env)
    return name


def log_episode_metrics(*, episode: Any, metrics_logger: Any = None, **_: Any) -> None:
    """An RLlib ``on_episode_end`` callback (``config.callbacks(on_episode_end=...)``): logs the
    env's final-step ``req99``, ``req95`` and ``attainment`` as env-runner metrics (mean over
    the last 100 episodes), so results carry ``result["env_runners"]["req99"]``."""
    if metrics_logger is None:
        return
    info = episode.get_infos(-1)
    for key in ("req99", "req95", "attainment"):
        if key in info:
            metrics_logger.log_value(key, float(info[key]), reduce="mean", window=100)


# (tag, path in an ``Algorithm.train()`` result) of the scalars worth a TensorBoard chart
RESULT_SCALARS = (
    ("charts/episode_return_mean", ("env_runners", "episode_return_mean")),
    ("charts/episode_len_mean", ("env_runners", "episode_len_mean")),
    ("charts/req99", ("env_runners", "req99")),
    ("charts/req95", ("env_runners", "req95")),
    ("charts/attainment", ("env_runners", "attainment")),
    ("losses/policy_loss", ("learners", "default_policy", "policy_loss")),
    ("losses/vf_loss", ("learners", "default_policy", "vf_loss")),
    ("losses/entropy", ("learners", "default_policy", "entropy")),
    ("losses/mean_kl_loss", ("learners", "default_policy", "mean_kl_loss")),
)


def result_step(result: Mapping[str, Any]) -> int:
    """The x of an ``Algorithm.train()`` result's charts: env steps sampled so far (lifetime)."""
    return int(result.get("env_runners", {}).get("num_env_steps_sampled_lifetime", 0))


def result_scalars(result: Mapping[str, Any]) -> dict[str, float]:
    """The :data:`RESULT_SCALARS` present (and finite) in an ``Algorithm.train()`` result, by
    tag. ``req99`` etc. appear once an episode ended (see :func:`log_episode_metrics`)."""
    out = {}
    for tag, path in RESULT_SCALARS:
        value: Any = result
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        if isinstance(value, int | float | np.number) and np.isfinite(value):
            out[tag] = float(value)
    return out


def ppo_config(env_config: Mapping[str, Any], *, train_batch_size: int = 512,
               minibatch_size: int = 128, num_epochs: int = 4, lr: float = 3e-4,
               num_env_runners: int = 0, hidden: int = 128, seed: int = 0) -> Any:
    """RLlib's ``PPOConfig`` (new API stack) for ``env_config`` (``hexagent_gym.make`` keys):
    the env registered under :data:`RLLIB_ENV_NAME` (registered here),
    :class:`~hexagent_gym.agents.rllib_module.MaskedPPOTorchRLModule` with an MLP of two
    ``hidden`` layers (and one in each head),
    :func:`log_episode_metrics` at every episode end, and ``seed`` for RLlib and the env resets.
    ``num_env_runners=0`` samples in the driver process (one env); more start Ray actors. Build
    it with ``.build_algo()`` after ``ray.init``; adjust it further with the usual
    ``PPOConfig`` methods."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from hexagent_gym.agents.rllib_module import MaskedPPOTorchRLModule

    register_rllib_env()
    return (
        PPOConfig()
        .environment(RLLIB_ENV_NAME, env_config=dict(env_config))
        .env_runners(num_env_runners=num_env_runners, num_envs_per_env_runner=1)
        .training(train_batch_size_per_learner=train_batch_size, minibatch_size=minibatch_size,
                  num_epochs=num_epochs, lr=lr)
        .rl_module(rl_module_spec=RLModuleSpec(
            module_class=MaskedPPOTorchRLModule,
            model_config={"fcnet_hiddens": [hidden, hidden], "head_fcnet_hiddens": [hidden]}))
        .callbacks(on_episode_end=log_episode_metrics)
        .debugging(seed=seed)  # seeds torch/numpy in RLlib and the env resets
    )


__all__ = ["MASK_KEY", "OBS_KEY", "RESULT_SCALARS", "RLLIB_ENV_NAME", "RLlibObservation",
           "log_episode_metrics", "make_rllib_env", "ppo_config", "register_rllib_env",
           "result_scalars", "result_step"]
