"""Training on a distribution of settings: :class:`MixtureEnv` draws a (cluster, trace, load)
setting at every reset from a mixture (``configs/mixtures/*.yaml``, docs/learned.md).

A mixture file::

    name: bfcl-mix
    episode: {num_workflows: 50}          # episode keys every setting shares
    settings:                             # fixed settings (any episode keys)
      - {cluster: hetero-1, trace: bfcl_v3, arrival_rate: 40.0}
    generated:                            # plus a pool of generated settings
      count: 8                            # how many
      seed: 0                             # their generator (the pool is fixed by it)
      clusters: {gpus: [a100, h100, h200], prefill: [3, 6], decode: [3, 6]}
      traces: [bfcl_v3]                   # one drawn per generated setting
      load: [3.0, 8.0]                    # offered prefill load (without reuse), uniform

Every setting (fixed ones first, then the generated pool) is one :class:`PDClusterEnv`; their
observation and action spaces are padded to the largest cluster (``p_max``/``d_max``), so one
vector env and one policy serve all of them. ``reset`` draws the setting uniformly from the
env's own ``np_random`` and then the episode seed, so a reset seed fixes both.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding

from hexagent_gym.cluster.cluster import load_cluster
from hexagent_gym.cluster.cluster_sampling import ClusterDistribution, sample_clusters
from hexagent_gym.cluster.hardware import check_keys
from hexagent_gym.config import ConfigError, load_named
from hexagent_gym.envs.encoding import MaskedDiscrete
from hexagent_gym.envs.pd_cluster_env import PDClusterEnv
from hexagent_gym.envs.rollout import RolloutResult
from hexagent_gym.episode import EPISODE_KEYS
from hexagent_gym.workload.specs import TraceError

_MIXTURE_KEYS = ("name", "description", "episode", "settings", "generated")
_GENERATED_KEYS = ("count", "seed", "clusters", "traces", "load")


def load_mixture(spec: str | Path | Mapping[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """(name, settings) of a mixture: a shipped name (``configs/mixtures``), a YAML path or a
    mapping. Each setting is a complete episode mapping (shared ``episode`` keys, then its own);
    generated clusters are registered by name (``hexagent_gym.cluster.cluster_sampling``).

    Raises:
        ConfigError: naming the file and field: unknown keys, no settings, a bad generated
            section (count, seed, traces, load range, cluster distribution).
    """
    if isinstance(spec, Mapping):
        data, source = dict(spec), "<mixture dict>"
    else:
        data, source = load_named("mixtures", spec)
    check_keys(data, _MIXTURE_KEYS, source)
    shared = data.get("episode") or {}
    if not isinstance(shared, Mapping):
        raise ConfigError(f"{source}: field 'episode' must be a mapping of episode keys")
    check_keys(shared, EPISODE_KEYS, f"{source}: field 'episode'")
    settings = []
    raw = data.get("settings") or []
    if not isinstance(raw, list):
        raise ConfigError(f"{source}: field 'settings' must be a list of episode mappings")
    for i, entry in enumerate(raw):
        where = f"{source}: settings[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where} must be a mapping of episode keys, got {entry!r}")
        check_keys(entry, EPISODE_KEYS, where)
        settings.append({**shared, **entry})
    if data.get("generated") is not None:
        settings += _generated(data["generated"], shared, f"{source}: field 'generated'")
    if not settings:
        raise ConfigError(f"{source}: no settings: give 'settings', 'generated' or both")
    return str(data.get("name") or Path(source).stem), settings


def _generated(gen: Any, shared: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    if not isinstance(gen, Mapping):
        raise ConfigError(f"{where} must be a mapping with keys {', '.join(_GENERATED_KEYS)}")
    check_keys(gen, _GENERATED_KEYS, where)
    count, seed = gen.get("count"), gen.get("seed", 0)
    for name, value, low in (("count", count, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{where}.{name} must be an integer >= {low}, got {value!r}")
    traces = gen.get("traces", ["bfcl_v3"])
    if not isinstance(traces, list) or not traces or not all(isinstance(t, str) for t in traces):
        raise ConfigError(f"{where}.traces must be a non-empty list of trace names, got "
                          f"{traces!r}")
    load = gen.get("load", [1.0, 1.0])
    ok = (isinstance(load, list) and len(load) == 2
          and all(isinstance(v, int | float) and not isinstance(v, bool) for v in load)
          and 0 < load[0] <= load[1])
    if not ok:
        raise ConfigError(f"{where}.load must be [lowest, highest] offered loads with "
                          f"0 < lowest <= highest, got {load!r}")
    dist = ClusterDistribution.from_mapping(gen.get("clusters") or {}, f"{where}.clusters")
    names = sample_clusters(dist, count, seed)
    rng = np.random.default_rng([seed, 1])  # traces and loads: a stream apart from the clusters
    out = []
    for name in names:
        trace = traces[int(rng.integers(len(traces)))]
        rho = round(float(rng.uniform(load[0], load[1])), 2)
        out.append({**shared, "cluster": name, "trace": trace, "load": rho,
                    "arrival_rate": None})
    return out


class MixtureEnv(gym.Env[dict[str, np.ndarray], np.int64]):
    """A :class:`PDClusterEnv` per setting of a mixture; each ``reset`` draws one (module
    docstring). Anything not defined here (``decision_point``, ``simulator``,
    ``encode_action``, ``config``, ``factory``, ``rollout``, ...) is the current setting's env's.

    Args:
        mixture: a mixture name, YAML path or mapping (:func:`load_mixture`).
        seed: seed of the first unseeded ``reset`` (then each unseeded reset continues the
            generator, as in Gymnasium).
        **overrides: env keys (``reward``, ``target_alpha``, ``p_max``, ...) and episode keys
            applied to every setting (after the mixture's own).

    Raises:
        ConfigError: a bad mixture or setting (naming the setting), or settings whose window K
            differs.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, mixture: str | Path | Mapping[str, Any], *, seed: int = 0,
                 render_mode: str | None = None, **overrides: Any) -> None:
        self.name, self.settings = load_mixture(mixture)
        shapes = []
        for s in self.settings:
            cluster = load_cluster(s["cluster"])
            shapes.append((len(cluster.prefill), len(cluster.decode)))
        pad = {"p_max": max(p for p, _ in shapes), "d_max": max(d for _, d in shapes)}
        pad.update({k: overrides.pop(k) for k in ("p_max", "d_max") if k in overrides})
        self.envs: list[PDClusterEnv] = []
        for i, s in enumerate(self.settings):
            try:
                env = PDClusterEnv({**s, **overrides}, render_mode=render_mode, **pad)
            except (ConfigError, TraceError) as exc:
                raise ConfigError(f"mixture '{self.name}', setting {i} ({s['cluster']} / "
                                  f"{s.get('trace')}): {exc}") from None
            if self.envs and env.k != self.envs[0].k:
                raise ConfigError(f"mixture '{self.name}': setting {i} has window K={env.k} but "
                                  f"setting 0 has K={self.envs[0].k}; set "
                                  f"max_calls_per_decision once, in 'episode'")
            self.envs.append(env)
        first = self.envs[0]
        self.observation_space = first.observation_space
        self.action_space = MaskedDiscrete(first.encoder.num_actions, self.action_masks)
        self.render_mode = render_mode
        self.default_seed = seed
        self.index = 0  # the setting of the current episode
        self._env = first

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[dict[str, np.ndarray], dict]:
        """Draw a setting, then reset its env with a seed drawn from the same generator."""
        if seed is None and self._np_random is None:
            seed = self.default_seed
        super().reset(seed=seed)
        self.index = int(self.np_random.integers(len(self.envs)))
        self._env = self.envs[self.index]
        obs, info = self._env.reset(seed=int(self.np_random.integers(2**31)))
        return obs, {**info, "setting": self.index}

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self._env.step(action)
        return obs, reward, terminated, truncated, {**info, "setting": self.index}

    def draw(self, seed: int | None) -> tuple[int, int]:
        """(setting index, its env's reset seed) that ``reset(seed=seed)`` uses (None: the
        first unseeded reset's)."""
        rng, _ = seeding.np_random(self.default_seed if seed is None else seed)
        return int(rng.integers(len(self.envs))), int(rng.integers(2**31))

    def rollout(self, policy: Any, seed: int | None = None,
                deterministic: bool = True) -> RolloutResult:
        """:meth:`PDClusterEnv.rollout` on the setting and episode ``reset(seed=seed)`` draws
        (the result's config names the setting)."""
        index, inner_seed = self.draw(seed)
        self.index, self._env = index, self.envs[index]
        return self._env.rollout(policy, seed=inner_seed, deterministic=deterministic)

    def action_masks(self) -> np.ndarray:
        return self._env.action_masks()

    def render(self) -> str | None:
        return self._env.render()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or "_env" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["_env"], name)


def _build_mixture(mixture: Any, rank: int, overrides: dict[str, Any]) -> MixtureEnv:
    env = MixtureEnv(mixture, **overrides)
    env.default_seed += rank
    return env


def make_mixture_fn(mixture: str | Path | Mapping[str, Any], *, rank: int = 0,
                    **overrides: Any) -> Callable[[], MixtureEnv]:
    """A picklable thunk building a :class:`MixtureEnv` (for vector envs); ``rank`` offsets the
    seed of the first unseeded reset, as :func:`hexagent_gym.envs.pd_cluster_env.make_env_fn`
    does."""
    return functools.partial(_build_mixture, mixture, rank, dict(overrides))


__all__ = ["MixtureEnv", "load_mixture", "make_mixture_fn"]
