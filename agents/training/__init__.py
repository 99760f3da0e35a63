"""Training a learned scheduler as a library: configuration, warm start, PPO, result.

:func:`train` runs the pipeline of ``scripts/train.py`` for a :class:`TrainConfig`:

1. seed (``stable_baselines3.common.utils.set_random_seed(config.seed)``, the only global
   seeding; envs seed from their config, sub-env i from the config seed + i);
2. build the training envs (``hexagent_gym.envs.make_env_fn``; in
   ``hexagent_gym.agents.shaping.ReferenceRelativeReward`` with ``relative_to``) and one
   evaluation env on the same episodes;
3. create (``hexagent_gym.agents.learned.make_model``) or load (``load_model``) the MaskablePPO
   model;
4. with ``init_from``, :func:`warm_start` it from that teacher: behaviour cloning, DAgger,
   optionally a lower logit temperature (``hexagent_gym.agents.imitation``);
5. run PPO while ``hexagent_gym.agents.callbacks.RolloutEvalCallback`` evaluates the model on
   fixed episodes next to HexAgent (and next to the ``baselines`` policies, evaluated once);
6. write to ``config.logdir``: TensorBoard events, progress.csv, best_model.zip and run.json;
   save the final model to ``config.out`` (default ``<logdir>/model.zip``);

and returns a :class:`TrainResult` with the files and the figures.
"""

from hexagent_gym.agents.training.config import (
    CHOICES,
    TRAIN_DEFAULTS,
    TrainConfig,
    TrainConfigError,
    episode_config,
)
from hexagent_gym.agents.training.pipeline import TrainResult, train
from hexagent_gym.agents.training.warmstart import DEMO_SEED, HELD_OUT_SEED, WarmStart, warm_start

__all__ = ["CHOICES", "DEMO_SEED", "HELD_OUT_SEED", "TRAIN_DEFAULTS", "TrainConfig",
           "TrainConfigError", "TrainResult", "WarmStart", "episode_config", "train",
           "warm_start"]
