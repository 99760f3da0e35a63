"""Episode configuration and a factory of simulators that shares per-cluster caches.

An episode is (cluster, trace, number of workflows, arrival process, seed, estimation error,
planning options). Experiment YAML files (``configs/experiments``) carry these keys at the top
level; keys this module does not know are returned to the caller (the env or the evaluation
grid), which must validate them.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from hexagent_gym.cluster.cluster import ClusterSpec, load_cluster
from hexagent_gym.config import ConfigError, load_named
from hexagent_gym.futures.horizon_predictors import (
    HorizonPredictor,
    RowCollector,
    make_horizon_predictor,
)
from hexagent_gym.futures.predictors import predictor_from_config
from hexagent_gym.planning.cluster_tables import ClusterTables
from hexagent_gym.sim.faults import FaultPlan, parse_faults
from hexagent_gym.sim.horizon import HorizonCache
from hexagent_gym.sim.load import offered_load, rate_for_load
from hexagent_gym.sim.simulator import DECODE_ADMISSION, Simulator
from hexagent_gym.workload.arrivals import EpisodeWorkload, sample_episode
from hexagent_gym.workload.lazy_trace import LazyWorkflows
from hexagent_gym.workload.workload import Trace, open_trace


@dataclass(frozen=True)
class EpisodeConfig:
    """What one simulated episode serves and how.

    Attributes:
        cluster: shipped cluster name or YAML path.
        trace: shipped trace name (sharegpt, bfcl_v3, lats, mixed) or JSONL path.
        num_workflows: workflows sampled per episode (None: the whole trace).
        arrival_rate: Poisson arrivals per second; None derives it from ``load``.
        load: prefill utilisation ρ that sets the rate when ``arrival_rate`` is None
            (``hexagent_gym.sim.load``); None with no rate replays the trace's ``arrival_s``.
        seed: seed of the episode generator (workflow sample, arrivals, estimation error).
        estimation_error: multiplicative error level e on scheduler-visible estimates.
        planning_latency: seconds from invocation to plan (0 = synchronous) or "measured".
        max_calls_per_decision: window K of calls shown per decision (None = all).
        plan_depth: re-plan at most the M oldest waiting calls (plus the unplaced ones) per
            invocation (None = all: exact, cost grows with the queue; docs/overload.md).
        prefix_cache: a prefix (KV) cache on every prefill instance (on by default, as in
            SGLang); False prefills every prompt from scratch.
        prefix_cache_tokens: tokens each prefill instance's cache holds (None: sized from the
            instance's KV memory; ``.inf`` in YAML / ``math.inf``: unbounded).
        prefix_block_tokens: tokens per prompt block for traces without hash ids (None: 512).
        parallel_sampling: serve a sample group as one request with ``n`` samples.
        length_predictor: scheduler-visible output-length predictor
            (``hexagent_gym.futures.predictors``: ``lognormal`` — a proxy model's error, the default
            —, ``bucket`` or ``oracle``, the true lengths); estimation error multiplies on top.
        length_predictor_params: its parameters (a mapping; None = defaults).
        decode_admission: ``predicted`` (reserve predicted demand, preempt on overrun) or
            ``true-demand`` (reserve the true demand, never preempt).
        free_decode_calls: a waiting decode call its instance has not served may be moved by a
            plan to another decode instance when its own cannot admit it (KV sent again).
        record_timeline: record every instance interval of the episode; its result then carries
            a ``timeline`` (Chrome trace, Gantt: docs/timelines.md). Observes only: every result
            is the same with it on or off.
        workflow_split: ``all`` the trace's workflows, or the ``train`` / ``eval`` half
            (:func:`split_of`, by a hash of the workflow id: the halves never share a workflow).
        horizon_predictor: forecast of each workflow's final horizon written to
            ``Workflow.h_pred`` (``hexagent_gym.futures.horizon_predictors``: ``none``,
            ``app-mean``, ``learned``, ``oracle`` — a bound); ``hexagent-horizon`` and the env read
            it.
        horizon_predictor_params: ``learned``'s parameters (a mapping; None = defaults).
        horizon_warm_start: episodes of the ``train`` half the predictor learns from before
            the first episode (0: online only). Needs ``workflow_split: eval``.
        faults: instance faults (docs/faults.md): null, or a mapping with ``events`` (a list of
            ``{time, instance, kind, duration[, factor]}``) and/or an MTBF/MTTR process
            (``mtbf``, ``mttr``, ``kinds``, ``pools``, ``slow_factor``, ``start``), drawn from
            the episode seed. Stored as a :class:`~hexagent_gym.sim.faults.FaultPlan`.
    """

    cluster: str = "hetero-1"
    trace: str = "bfcl_v3"
    num_workflows: int | None = 400
    arrival_rate: float | None = None
    load: float | None = 0.8
    seed: int = 0
    estimation_error: float = 0.0
    planning_latency: float | str = 0.0
    max_calls_per_decision: int | None = None
    plan_depth: int | None = None
    prefix_cache: bool = True
    prefix_cache_tokens: float | None = None
    prefix_block_tokens: int | None = None
    parallel_sampling: bool = True
    length_predictor: str = "lognormal"
    length_predictor_params: Mapping[str, Any] | tuple | None = None
    decode_admission: str = "predicted"
    free_decode_calls: bool = True
    record_timeline: bool = False
    workflow_split: str = "all"
    horizon_predictor: str = "none"
    horizon_predictor_params: Mapping[str, Any] | tuple | None = None
    horizon_warm_start: int = 0
    faults: FaultPlan | Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        src = "episode config"
        if self.num_workflows is not None and (not isinstance(self.num_workflows, int)
                                               or isinstance(self.num_workflows, bool)
                                               or self.num_workflows < 1):
            raise ConfigError(f"{src}: num_workflows must be an integer >= 1 or null, got "
                              f"{self.num_workflows!r}")
        for name in ("arrival_rate", "load"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)
                                  or not 0 < v < math.inf):
                raise ConfigError(f"{src}: {name} must be a finite number > 0 or null, got "
                                  f"{v!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ConfigError(f"{src}: seed must be an integer >= 0, got {self.seed!r}")
        e = self.estimation_error
        if isinstance(e, bool) or not isinstance(e, int | float) or not 0 <= e < 1:
            raise ConfigError(f"{src}: estimation_error must be in [0, 1), got {e!r}")
        pl = self.planning_latency
        if pl != "measured" and (isinstance(pl, bool) or not isinstance(pl, int | float)
                                 or not 0 <= pl < math.inf):
            raise ConfigError(f"{src}: planning_latency must be finite seconds >= 0 or "
                              f"'measured', got {pl!r}")
        for name in ("max_calls_per_decision", "plan_depth"):
            k = getattr(self, name)
            if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
                raise ConfigError(f"{src}: {name} must be an integer >= 1 or null, got {k!r}")
        if self.max_calls_per_decision is not None and self.plan_depth is not None:
            raise ConfigError(f"{src}: set max_calls_per_decision or plan_depth, not both")
        for name in ("prefix_cache", "parallel_sampling", "free_decode_calls", "record_timeline"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{src}: {name} must be true or false, got "
                                  f"{getattr(self, name)!r}")
        c = self.prefix_cache_tokens
        if c is not None and (isinstance(c, bool) or not isinstance(c, int | float) or not c >= 0):
            raise ConfigError(f"{src}: prefix_cache_tokens must be a number of tokens >= 0, .inf "
                              f"(unbounded) or null (sized from memory), got {c!r}")
        params = self.length_predictor_params
        if isinstance(params, Mapping):  # stored as sorted pairs: configs are hashable keys
            object.__setattr__(self, "length_predictor_params", tuple(sorted(params.items())))
        elif params is not None and not isinstance(params, tuple):
            raise ConfigError(f"{src}: length_predictor_params must be a mapping or null, got "
                              f"{params!r}")
        try:
            predictor_from_config(self.length_predictor, self.predictor_params)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{src}: length_predictor: {exc}") from None
        if self.decode_admission not in DECODE_ADMISSION:
            raise ConfigError(f"{src}: decode_admission must be one of "
                              f"{', '.join(DECODE_ADMISSION)}, got {self.decode_admission!r}")
        b = self.prefix_block_tokens
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
            raise ConfigError(f"{src}: prefix_block_tokens must be an integer >= 1 or null (512), "
                              f"got {b!r}")
        self._check_horizon_settings(src)
        plan = parse_faults(self.faults, src)
        object.__setattr__(self, "faults", plan)
        if plan is not None:  # instances must exist: checked before any episode runs
            try:
                cluster = load_cluster(self.cluster)
            except ConfigError:
                return  # the factory reports the unknown cluster itself
            plan.check_cluster(len(cluster.prefill), len(cluster.decode), src)

    def _check_horizon_settings(self, src: str) -> None:
        if self.workflow_split not in WORKFLOW_SPLITS:
            raise ConfigError(f"{src}: workflow_split must be one of {', '.join(WORKFLOW_SPLITS)}"
                              f", got {self.workflow_split!r}")
        params = self.horizon_predictor_params
        if isinstance(params, Mapping):
            object.__setattr__(self, "horizon_predictor_params", tuple(sorted(params.items())))
        elif params is not None and not isinstance(params, tuple):
            raise ConfigError(f"{src}: horizon_predictor_params must be a mapping or null, got "
                              f"{params!r}")
        try:
            make_horizon_predictor(self.horizon_predictor, **dict(self.horizon_predictor_params
                                                                  or ()))
        except ValueError as exc:
            raise ConfigError(f"{src}: horizon_predictor: {exc}") from None
        w = self.horizon_warm_start
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ConfigError(f"{src}: horizon_warm_start must be an integer >= 0 (training "
                              f"episodes), got {w!r}")
        if w and self.horizon_predictor not in ("app-mean", "learned"):
            raise ConfigError(f"{src}: horizon_warm_start needs a predictor that learns "
                              f"(app-mean or learned), not {self.horizon_predictor!r}")
        if w and self.workflow_split != "eval":
            raise ConfigError(f"{src}: horizon_warm_start learns from the train half of the "
                              f"trace, so the episodes must come from the other half: set "
                              f"workflow_split: eval (got {self.workflow_split!r}, which "
                              f"overlaps the training workflows)")

    @property
    def predictor_params(self) -> dict[str, Any]:
        """``length_predictor_params`` as a dict."""
        return dict(self.length_predictor_params or ())

    def replace(self, **changes: Any) -> EpisodeConfig:
        return dataclasses.replace(self, **changes)


WORKFLOW_SPLITS = ("all", "train", "eval")
WARM_START_SEED = 1_000_003
"""Seed of the first warm-start episode (the next ones count up): fixed, so every cell of a
factory learns from the same training episodes."""


def split_of(workflow_id: str) -> str:
    """``train`` or ``eval``: the half of a trace a workflow belongs to, by the CRC-32 of its
    id (stable across runs, machines and traces: a workflow of the Mixed trace falls in the
    same half as in its own trace)."""
    return "train" if zlib.crc32(workflow_id.encode()) % 2 == 0 else "eval"


def split_trace(trace: Trace, split: str) -> Trace:
    """``trace`` itself (``all``) or the sub-trace of one half (:func:`split_of`).

    Raises:
        ConfigError: the half holds no workflow.
    """
    if split == "all":
        return trace
    if isinstance(trace.workflows, LazyWorkflows):  # ids only: no workflow is parsed
        kept: Any = trace.workflows.where_id(lambda wid: split_of(wid) == split)
    else:
        kept = tuple(w for w in trace.workflows if split_of(w.workflow_id) == split)
    if not kept:
        raise ConfigError(f"workflow_split: the {split} half of trace '{trace.name}' is empty "
                          f"(its {len(trace.workflows)} workflow(s) all fall in the other half)")
    return dataclasses.replace(trace, name=f"{trace.name}[{split}]", workflows=kept)


EPISODE_KEYS = tuple(f.name for f in fields(EpisodeConfig))
# Descriptive and evaluation-grid keys an experiment file may carry besides the episode keys;
# consumers that only simulate (the env) ignore them.
EXPERIMENT_META_KEYS = ("name", "description", "grid", "report")


def load_config(config: str | Path | Mapping[str, Any] | None = None,
                **overrides: Any) -> tuple[EpisodeConfig, dict[str, Any], str]:
    """Read an experiment config (shipped name, YAML path, mapping or None) plus overrides.

    Returns:
        (episode config, the other keys for the caller to validate, source label).
    """
    if config is None:
        data, source = {}, "<defaults>"
    elif isinstance(config, Mapping):
        data, source = dict(config), "<dict>"
    else:
        data, source = load_named("experiments", config)
    data.update(overrides)
    episode = {k: data.pop(k) for k in list(data) if k in EPISODE_KEYS}
    try:
        cfg = EpisodeConfig(**episode)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return cfg, data, source


class EpisodeFactory:
    """Builds one :class:`Simulator` per episode, sharing the cluster tables, the loaded trace
    and the standalone-horizon cache across episodes (the expensive, seed-independent parts)."""

    def __init__(self, config: EpisodeConfig) -> None:
        self.config = config
        self.cluster: ClusterSpec = load_cluster(config.cluster)
        # read lazily: an episode parses the workflows it samples (all of them when `load`
        # sets the rate: the offered load averages over the whole trace). Calls that no decode
        # instance can hold are errors naming their line, before their block ids are built.
        # The model's context length is not passed: bfcl_v3 holds a 49,354-token call and
        # Qwen3's context is 40,960, so existing qwen-* cells would stop running.
        self.trace: Trace = split_trace(
            open_trace(config.trace, config.prefix_block_tokens,
                       max_kv_tokens=self.cluster.max_decode_kv_tokens),
            config.workflow_split)
        self.tables = ClusterTables(self.cluster)
        self.horizons = HorizonCache(self.cluster, self.tables, **self.serving)
        # ids of the trace's workflow specs whose KV demand and group width an episode checked
        # (the trace keeps them alive): later episodes skip them
        self._checked_specs: set[int] = set()
        self._horizon_predictor: HorizonPredictor | None = None  # warm-started once
        if config.arrival_rate is not None:
            self.arrival_rate: float | None = float(config.arrival_rate)
        elif config.load is not None:
            self.arrival_rate = rate_for_load(self.tables, self.trace.workflows, config.load)
        else:
            self.arrival_rate = None  # replay the trace's arrival_s

    @property
    def serving(self) -> dict[str, Any]:
        """The serving options the simulator and the standalone horizons share."""
        cfg = self.config
        return {"prefix_cache": cfg.prefix_cache, "prefix_cache_tokens": cfg.prefix_cache_tokens,
                "parallel_sampling": cfg.parallel_sampling}

    @property
    def offered_load(self) -> float | None:
        """Prefill utilisation of this factory's arrival rate (None when replaying)."""
        if self.arrival_rate is None:
            return None
        return offered_load(self.tables, self.trace.workflows, self.arrival_rate)

    def fill_horizons(self) -> int:
        """Compute the standalone horizon of every workflow of the trace now (episodes compute
        each one on first arrival and keep it): the cache a long training run converges to.
        Returns how many the cache holds."""
        for spec in self.trace.workflows:
            self.horizons.get(spec)
        return len(self.horizons)

    def horizon_predictor(self) -> HorizonPredictor | None:
        """The episode's horizon predictor, built (and warm-started) once per factory; each
        simulator gets a ``fresh()`` copy. None for ``none``."""
        cfg = self.config
        if cfg.horizon_predictor == "none":
            return None
        if self._horizon_predictor is None:
            warm = None
            if cfg.horizon_warm_start:
                warm = {"rows": self.horizon_rows("train", cfg.horizon_warm_start)}
            self._horizon_predictor = make_horizon_predictor(
                cfg.horizon_predictor, warm, **dict(cfg.horizon_predictor_params or ()))
        return self._horizon_predictor.fresh()

    def horizon_rows(self, split: str, episodes: int,
                     first_seed: int = WARM_START_SEED) -> list[tuple[str, list[float], float]]:
        """Horizon-predictor rows (:class:`~hexagent_gym.futures.horizon_predictors.RowCollector`)
        from ``episodes`` episodes of one half of the trace (seeds ``first_seed``, ``+1``, ...),
        served by the core's fallback with this config's cluster, rate and serving options:
        the warm start's training data (``train``), or held-out rows (``eval``)."""
        half = EpisodeFactory(self.config.replace(workflow_split=split,
                                                  horizon_predictor="none",
                                                  horizon_predictor_params=None,
                                                  horizon_warm_start=0))
        collector = RowCollector()
        for i in range(episodes):
            sim = half.simulator(first_seed + i, horizon_predictor=collector)
            sim.run(close=True)
        return collector.rows

    def workload(self, seed: int) -> tuple[EpisodeWorkload, np.random.Generator]:
        """Sample the episode's workflows and arrivals; returns the generator for the rest."""
        rng = np.random.default_rng(seed)
        work = sample_episode(self.trace, self.config.num_workflows, rng, self.arrival_rate)
        return work, rng

    def simulator(self, seed: int | None = None, decisions: bool = True,
                  record_timeline: bool | None = None,
                  horizon_predictor: HorizonPredictor | None = None) -> Simulator:
        """A fresh simulator for one episode (``seed`` defaults to the config's,
        ``record_timeline`` to the config's: pass True to record one episode of a factory
        built without it, sharing its caches; ``horizon_predictor`` to the config's)."""
        cfg = self.config
        if record_timeline is None:
            record_timeline = cfg.record_timeline
        work, rng = self.workload(cfg.seed if seed is None else seed)
        return Simulator(self.cluster, work, estimation_error=cfg.estimation_error, rng=rng,
                         decisions=decisions, planning_latency=cfg.planning_latency,
                         max_calls_per_decision=cfg.max_calls_per_decision,
                         plan_depth=cfg.plan_depth,
                         horizons=self.horizons, tables=self.tables,
                         length_predictor=cfg.length_predictor,
                         length_predictor_params=cfg.predictor_params,
                         decode_admission=cfg.decode_admission,
                         free_decode_calls=cfg.free_decode_calls,
                         record_timeline=record_timeline, checked_specs=self._checked_specs,
                         faults=cfg.faults, fault_seed=cfg.seed if seed is None else seed,
                         horizon_predictor=(horizon_predictor if horizon_predictor is not None
                                            else self.horizon_predictor() if decisions
                                            else None),
                         **self.serving)
