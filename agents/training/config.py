"""The configuration of a training run: :class:`TrainConfig`, its validation and the episodes
it describes."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from hexagent_gym.config import ConfigError

TRAIN_DEFAULTS: dict[str, Any] = {
    "cluster": "hetero-1",
    "trace": "bfcl_v3",
    "num_workflows": 100,
    "load": 1.0,
}
"""Training episodes unless ``config`` or the episode fields say otherwise: small enough
(≈ 1,000 picks) that PPO sees many terminal rewards, loaded enough that queues form."""

CHOICES: dict[str, tuple[str, ...]] = {
    "relative_to": ("none", "hexagent"),
    "vec": ("dummy", "subproc"),
    "policy": ("equivariant", "mlp"),
    "init_from": ("none", "hexagent", "hexagent-lookahead", "hexagent-search"),
}
"""The valid values of the TrainConfig fields that name one of a few options."""

class TrainConfigError(ConfigError):
    """A :class:`TrainConfig` field is invalid; ``field`` names it, ``reason`` says what would
    be valid."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"TrainConfig.{field} {reason}")


@dataclass(frozen=True)
class TrainConfig:
    """Every option of a training run: the flags of ``scripts/train.py``, same names (``--n-envs``
    is ``n_envs``) and defaults.

    Episodes: ``mixture`` (a ``configs/mixtures`` name or YAML path,
    ``hexagent_gym.envs.mixture``): the training and teacher episodes draw a setting per reset from
    it, and the episode fields below set only the evaluation episodes. Otherwise ``config`` (an
    experiment YAML path or a configs/experiments name; only its episode keys apply) or, without it,
    :data:`TRAIN_DEFAULTS`; then each of ``cluster``, ``trace``, ``num_workflows``, ``load``
    (offered prefill load ρ; setting it drops the config's ``arrival_rate``), ``p_max``,
    ``d_max`` (slot padding, for ``policy="mlp"`` transfer) that is not None, the ``seed``,
    ``reward`` (``envs/rewards.py`` name), ``target_alpha`` and ``terminal_weight`` (the tail
    reward's terminal −(Req99 − 1) weight, or the relative reward's with ``relative_to``).
    ``relative_to="hexagent"`` trains on the reward relative to HexAgent on the same episode.
    ``n_envs`` training envs in a ``vec`` ("dummy": one process, "subproc": one process each)
    vector env.

    Model: ``policy`` ("equivariant", with ``hidden`` embedding width, ``prior`` initial
    weight of its HexAgent indicators and ``cache_feature`` (read the cache affinity
    ``obs["cached"]``), or "mlp"), or ``load_model`` to continue a saved model;
    MaskablePPO ``total_timesteps``, ``lr``, ``n_steps`` (per env), ``batch_size``,
    ``n_epochs``, ``gamma``, ``gae_lambda``, ``clip_range``, ``ent_coef``.

    Warm start (with ``init_from`` a teacher, see :func:`hexagent_gym.agents.training.warm_start`):
    ``bc_episodes``, ``bc_epochs``, ``bc_lr``, ``bc_value_coef``, ``dagger_rounds``,
    ``dagger_episodes``, ``bc_target_prob`` (0 keeps the cloned sharpness), ``demos`` (a
    ``.npz`` cache of the teacher's cloning and held-out episodes: loaded when it exists and was
    collected by the same teacher on the same episodes, else collected and written; teachers
    like ``hexagent-search`` take minutes per episode). ``init_from`` names the teacher:
    ``hexagent``, ``hexagent-lookahead`` or ``hexagent-search`` (rollout search, expert
    iteration's teacher: ``agents/search.py``).

    Evaluation and output: every ``eval_every`` env steps on reset seeds ``eval_seeds`` (episodes
    of ``eval_num_workflows`` workflows, None: as training); ``baselines``, registered policy
    names (e.g. ``("random", "fcfs")``) evaluated once on the same episodes, printed and logged
    next to every evaluation as references; ``threads`` torch threads;
    ``logdir``; ``out`` (None: ``<logdir>/model.zip``); ``verbose`` 0 quiet, 1 a line per
    evaluation and warm-start stage, 2 also SB3's table.

    Every field is checked here except the names of ``config``, ``cluster``, ``trace``,
    ``reward`` and ``baselines``, which :func:`hexagent_gym.agents.training.train` resolves
    before it writes anything.

    Raises:
        TrainConfigError: a field's value is invalid; the message names the field and what
            would be valid.
    """

    # episodes
    config: str | Path | Mapping[str, Any] | None = None
    mixture: str | Path | None = None
    cluster: str | None = None
    trace: str | None = None
    num_workflows: int | None = None
    load: float | None = None
    p_max: int | None = None
    d_max: int | None = None
    reward: str = "tail"
    target_alpha: float | None = None
    terminal_weight: float | None = None
    relative_to: str = "none"
    n_envs: int = 2
    vec: str = "dummy"
    # model
    policy: str = "equivariant"
    load_model: Path | None = None
    init_from: str = "none"
    total_timesteps: int = 100_000
    lr: float = 1e-4
    n_steps: int = 512
    batch_size: int = 256
    n_epochs: int = 4
    gamma: float = 0.995
    gae_lambda: float = 0.95
    clip_range: float = 0.1
    ent_coef: float = 0.001
    hidden: int = 64
    prior: float = 4.0
    cache_feature: bool = False
    # warm start
    bc_episodes: int = 8
    bc_epochs: int = 3
    bc_lr: float = 3e-3
    bc_value_coef: float = 0.5
    dagger_rounds: int = 2
    dagger_episodes: int = 4
    bc_target_prob: float = 0.0
    demos: Path | None = None
    # evaluation and output
    eval_every: int = 10_000
    eval_seeds: tuple[int, ...] = (10_000,)
    eval_num_workflows: int | None = None
    baselines: tuple[str, ...] = ()
    seed: int = 0
    threads: int = 1
    logdir: Path = Path("runs/learned")
    out: Path | None = None
    verbose: int = 1

    def __post_init__(self) -> None:
        for name in ("logdir", "load_model", "out", "demos"):
            value = getattr(self, name)
            if value is None and name != "logdir":
                continue
            if not isinstance(value, str | Path):
                raise TrainConfigError(name, f"must be a path, got {value!r}")
            object.__setattr__(self, name, Path(value))
        try:
            seeds = tuple(operator.index(s) for s in self.eval_seeds)
        except TypeError:
            raise TrainConfigError("eval_seeds", f"must be a sequence of integer reset seeds, "
                                   f"got {self.eval_seeds!r}") from None
        if not seeds:
            raise TrainConfigError("eval_seeds", "must list at least one reset seed, got none")
        object.__setattr__(self, "eval_seeds", seeds)
        # a bare string would iterate as one-letter names
        names = None if isinstance(self.baselines, str) else _tuple_or_none(self.baselines)
        if names is None or not all(isinstance(b, str) and b for b in names):
            raise TrainConfigError("baselines", f"must be a sequence of policy names, got "
                                   f"{self.baselines!r}")
        object.__setattr__(self, "baselines", names)
        for name, valid in CHOICES.items():
            if getattr(self, name) not in valid:
                raise TrainConfigError(name, f"must be one of {', '.join(map(repr, valid))}, "
                                       f"got {getattr(self, name)!r}")
        for name, low in _INT_MIN.items():
            value = getattr(self, name)
            if value is None and name in _OPTIONAL:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                none = " or None" if name in _OPTIONAL else ""
                raise TrainConfigError(name, f"must be an integer >= {low}{none}, got {value!r}")
        for name, (ok, valid) in _NUMBERS.items():
            value = getattr(self, name)
            if value is None and name in _OPTIONAL:
                continue
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or not math.isfinite(value) or not ok(value)):
                none = " or None" if name in _OPTIONAL else ""
                raise TrainConfigError(name, f"must be {valid}{none}, got {value!r}")
        if self.mixture is not None and not isinstance(self.mixture, str | Path):
            raise TrainConfigError("mixture", f"must be a mixture name or YAML path, got "
                                   f"{self.mixture!r}")
        if not isinstance(self.cache_feature, bool):
            raise TrainConfigError("cache_feature", f"must be True or False, got "
                                   f"{self.cache_feature!r}")
        if self.cache_feature and self.policy != "equivariant":
            raise TrainConfigError("cache_feature", "is an input of the equivariant policy; "
                                   f"policy={self.policy!r} has no such option")
        if self.demos is not None and self.init_from == "none":
            raise TrainConfigError("demos", "caches a teacher's demonstrations: it needs "
                                   "init_from (a teacher), got init_from='none'")
        if self.bc_target_prob > 0.0 and self.policy == "mlp" and self.load_model is None:
            # calibrate_temperature scales the equivariant network's logits; the MLP has none
            raise TrainConfigError("bc_target_prob", "must be 0 with policy='mlp' (only the "
                                   f"equivariant policy has a logit scale), got "
                                   f"{self.bc_target_prob!r}")

    @property
    def model_path(self) -> Path:
        """Where the final model is saved: ``out``, or ``<logdir>/model.zip``."""
        return self.out if self.out is not None else self.logdir / "model.zip"

    def to_dict(self) -> dict[str, Any]:
        """The fields by name, paths as strings (run.json's ``args``)."""
        return {f.name: (str(v) if isinstance(v := getattr(self, f.name), Path) else v)
                for f in fields(self)}


_OPTIONAL = frozenset(("num_workflows", "load", "p_max", "d_max", "target_alpha",
                       "terminal_weight", "eval_num_workflows"))
_INT_MIN = {"num_workflows": 1, "p_max": 1, "d_max": 1, "n_envs": 1, "total_timesteps": 0,
            "n_steps": 1, "batch_size": 2, "n_epochs": 1, "hidden": 1, "bc_episodes": 1,
            "bc_epochs": 0, "dagger_rounds": 0, "dagger_episodes": 1, "eval_every": 1,
            "eval_num_workflows": 1, "seed": 0, "threads": 1, "verbose": 0}


def _tuple_or_none(value: Any) -> tuple[Any, ...] | None:
    try:
        return tuple(value)
    except TypeError:
        return None


def _positive(v: float) -> bool:
    return v > 0


def _non_negative(v: float) -> bool:
    return v >= 0


def _any(v: float) -> bool:
    return True


_NUMBERS: dict[str, tuple[Callable[[float], bool], str]] = {
    "load": (_positive, "a number > 0"),
    "target_alpha": (_positive, "a number > 0"),
    "terminal_weight": (_any, "a finite number"),
    "lr": (_positive, "a number > 0"),
    "gamma": (lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "gae_lambda": (lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "clip_range": (_positive, "a number > 0"),
    "ent_coef": (_non_negative, "a number >= 0"),
    "prior": (_any, "a finite number"),
    "bc_lr": (_positive, "a number > 0"),
    "bc_value_coef": (_non_negative, "a number >= 0"),
    "bc_target_prob": (lambda v: 0 <= v < 1, "a probability in [0, 1) (0: keep the cloned "
                       "sharpness)"),
}


def episode_config(config: TrainConfig) -> tuple[Any, dict[str, Any]]:
    """(env config, keyword overrides) of the training episodes, as described in
    :class:`TrainConfig`; ``PDClusterEnv(*episode_config(c))`` is one training env."""
    overrides: dict[str, Any] = {} if config.config else dict(TRAIN_DEFAULTS)
    for key in ("cluster", "trace", "num_workflows", "load", "p_max", "d_max"):
        value = getattr(config, key)
        if value is not None:
            overrides[key] = value
    if config.load is not None:
        overrides["arrival_rate"] = None
    overrides.update(seed=config.seed, reward=config.reward)
    if config.target_alpha is not None:
        overrides["target_alpha"] = config.target_alpha
    if config.terminal_weight is not None and config.relative_to == "none":
        overrides["reward_kwargs"] = {"terminal_weight": config.terminal_weight}
    return config.config, overrides


__all__ = ["CHOICES", "TRAIN_DEFAULTS", "TrainConfig", "TrainConfigError", "episode_config"]
