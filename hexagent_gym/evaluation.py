"""Evaluation grids: policies × clusters × traces × loads × estimation errors × variants × seeds.

An *experiment* (``configs/experiments/*.yaml``, schema in ``docs/evaluation.md``) expands into
*cells*. A cell is one episode of one policy: a :class:`Cell` holds only picklable parameters, and
:func:`run_cell` is a pure function of them (same cell → same record, apart from the wall-clock
``timing`` block), so any backend can run cells anywhere and in any order. Cells that share every
episode parameter except the seed share one :class:`~hexagent_gym.episode.EpisodeFactory`, whose
cluster tables and standalone-horizon cache are the expensive, seed-independent part.

:func:`evaluate` runs the cells that are not finished yet and appends one JSON line per finished
cell to ``cells.jsonl``, so an interrupted run resumes where it stopped. :func:`summarize` turns
the records into table rows: Req95/Req99 per policy (mean ± 95% CI over seeds), the offered load
of each row, and the reduction of the reference policy (HexAgent) against the best of a set of
baselines. ``hexagent_gym.plots`` draws the attainment curves and load sweeps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hexagent_gym.config import ConfigError, resolve_config, suggest
from hexagent_gym.episode import (
    EPISODE_KEYS,
    EXPERIMENT_META_KEYS,
    EpisodeConfig,
    EpisodeFactory,
    load_config,
)
from hexagent_gym.metrics import req
from hexagent_gym.policy import make_policy, policy_names, run_policy

RECORD_SCHEMA = 1
"""Version of the cell record layout; part of every cell key, so a layout change re-runs cells."""

DEFAULT_POLICIES = ("hexagent", "fcfs", "wf-fcfs", "llf", "atlas")
DEFAULT_BASELINES = ("wf-fcfs", "llf", "atlas")
METRICS = ("req95", "req99", "mean_ratio", "max_ratio", "prefix_hit_rate", "prefill_load",
           "faster_than_alone", "decode_kv_peak", "preemptions", "decode_wait_mean",
           "decode_kv_delayed", "decode_moves")
"""Per-cell metrics a report may tabulate (``report.metrics``): the SLO scales, the prefix-cache
hit rate, ρ with the cache (prefill load of the work actually computed), the share of
workflows that finished sooner than alone, and the decode regime counters (peak KV use ÷
capacity, preemptions, mean decode-queue wait in seconds, share of calls held back by KV)."""
SLO_METRICS = ("req95", "req99", "mean_ratio", "max_ratio")
"""Metrics where lower is better: tables give the reference's reduction against the best
baseline for these only (the others describe the regime)."""

TOP_LEVEL_KEYS = EXPERIMENT_META_KEYS  # the keys load_config leaves for us (and the env ignores)
GRID_KEYS = ("policies", "clusters", "traces", "seeds", "loads", "estimation_errors",
             "per_trace", "variants", "policy_kwargs")
REPORT_KEYS = ("metrics", "reference", "baselines", "overhead", "by_size")
# Episode fields a per-trace entry or a variant may set (the axes set the others).
_SETTABLE = tuple(k for k in EPISODE_KEYS if k not in ("cluster", "trace", "seed"))
_FLOAT_FIELDS = ("arrival_rate", "load", "estimation_error", "planning_latency")


# --------------------------------------------------------------------------------------------------
# Cells
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cell:
    """One episode of one policy: everything :func:`run_cell` needs, and nothing else.

    Attributes:
        policy: registered policy name (``hexagent_gym.policy.policy_names``).
        episode: the episode (cluster, trace, workflows, load, seed, estimation error, ...).
        policy_kwargs: constructor arguments of the policy, as sorted (name, value) pairs.
        variant: name of the grid variant that produced the cell ("" when the grid has none).
    """

    policy: str
    episode: EpisodeConfig
    policy_kwargs: tuple[tuple[str, Any], ...] = ()
    variant: str = ""

    @property
    def params(self) -> dict[str, Any]:
        """The cell's parameters as canonical JSON-ready data (ints in float fields are floats)."""
        episode = dataclasses.asdict(self.episode)
        for k in _FLOAT_FIELDS:
            v = episode[k]
            if isinstance(v, int) and not isinstance(v, bool):
                episode[k] = float(v)
        return {"policy": self.policy, "policy_kwargs": _jsonable(dict(self.policy_kwargs)),
                "variant": self.variant, "episode": episode}

    @property
    def key(self) -> str:
        """Stable id of the cell (hash of its parameters and the record schema)."""
        text = json.dumps({"schema": RECORD_SCHEMA, **self.params}, sort_keys=True,
                          separators=(",", ":"))
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    @property
    def factory_config(self) -> EpisodeConfig:
        """The episode config without its seed: cells equal in it share one factory."""
        return self.episode.replace(seed=0)

    def describe(self) -> str:
        e = self.episode
        load = f"ρ={e.load:g}" if e.arrival_rate is None and e.load is not None else (
            f"λ={e.arrival_rate:g}/s" if e.arrival_rate is not None else "replay")
        err = f" err={e.estimation_error:g}" if e.estimation_error else ""
        var = f" [{self.variant}]" if self.variant else ""
        return f"{self.policy} {e.cluster}/{e.trace} {load}{err}{var} seed {e.seed}"


def run_cell(cell: Cell, factory: EpisodeFactory | None = None, *,
             timing: bool = True) -> dict[str, Any]:
    """Run one cell and return its JSON-ready record.

    Args:
        cell: the cell.
        factory: a factory built from ``cell.factory_config`` to share caches with other cells
            (built here when None).
        timing: include the wall-clock ``timing`` block (scheduler time per invocation, episode
            wall time). Every other field is a deterministic function of the cell.

    Returns:
        ``{"schema", "key", "cell", "arrival_rate", "offered_load", "metrics", "workflows",
        ["timing"]}``; ``workflows`` holds per-workflow columns (id, trace index, number of calls,
        standalone horizon H_w in seconds, ratio C_w/H_w) in the episode's arrival order.
    """
    if factory is None:
        factory = EpisodeFactory(cell.factory_config)
    elif factory.config != cell.factory_config:
        raise ValueError(f"the factory was built for {factory.config}, not for this cell's "
                         f"episode {cell.factory_config}; build it from cell.factory_config")
    policy = make_policy(cell.policy, **dict(cell.policy_kwargs))
    start = time.perf_counter()
    result = run_policy(factory.simulator(cell.episode.seed), policy)
    cell_seconds = time.perf_counter() - start
    ratios = np.asarray(result.ratios, dtype=np.float64)
    record: dict[str, Any] = {
        "schema": RECORD_SCHEMA,
        "key": cell.key,
        "cell": cell.params,
        "arrival_rate": factory.arrival_rate,
        "offered_load": factory.offered_load,
        "metrics": {
            "req95": result.req95,
            "req99": result.req99,
            "mean_ratio": float(ratios.mean()) if len(ratios) else math.nan,
            "max_ratio": float(ratios.max()) if len(ratios) else math.nan,
            "prefix_hit_rate": result.prefix_hit_rate,
            "prefill_load": result.prefill_load,
            "faster_than_alone": result.faster_than_alone,
            "decode_kv_peak": result.decode_kv_peak,
            "preemptions": result.preemptions,
            "decode_wait_mean": result.decode_wait_mean,
            "decode_kv_delayed": result.decode_kv_delayed,
            "decode_moves": result.decode_moves,
            "num_workflows": result.num_workflows,
            "num_calls": result.num_calls,
            "invocations": result.invocations,
            "decisions": result.decisions,
            "sim_seconds": result.sim_seconds,
        },
        "workflows": {
            "workflow_id": [r.workflow_id for r in result.records],
            "trace_index": [int(r.trace_index) for r in result.records],
            "num_calls": [int(r.num_calls) for r in result.records],
            "horizon": [float(r.horizon) for r in result.records],
            "ratio": [float(x) for x in ratios],
        },
    }
    if timing:
        record["timing"] = {
            "scheduler_seconds": result.scheduler_seconds,
            "scheduler_ms_per_invocation": result.scheduler_ms_per_invocation,
            "scheduler_ms_median": result.scheduler_ms_median,
            "scheduler_ms_p99": (1e3 * float(np.quantile(result.invocation_seconds, 0.99))
                                 if len(result.invocation_seconds) else 0.0),
            "engine_seconds": result.wall_seconds,
            "cell_seconds": cell_seconds,
        }
    return record


@dataclass(frozen=True)
class CellFailure:
    """A cell that raised instead of returning a record: its parameters and its error.

    Attributes:
        key: the cell's key (:attr:`Cell.key`).
        cell: the cell's parameters (:attr:`Cell.params`), JSON-ready.
        description: one-line summary of the cell (:meth:`Cell.describe`).
        error: ``"ExceptionType: message"``.
        traceback: the formatted traceback (from the process that ran the cell).
    """

    key: str
    cell: dict[str, Any]
    description: str
    error: str
    traceback: str = ""

    @classmethod
    def of(cls, cell: Cell, exc: BaseException, tb: str | None = None) -> CellFailure:
        if tb is None:
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(cell.key, cell.params, cell.describe(), _error_text(exc), tb)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def format(self) -> str:
        """Three lines: the cell, its parameters as JSON, the error."""
        params = json.dumps(self.cell, sort_keys=True, separators=(", ", ": "))
        return (f"FAILED {self.description} [key {self.key}]\n"
                f"  params: {params}\n"
                f"  error: {self.error}")


class CellError(RuntimeError):
    """Raised by :func:`evaluate` with ``fail_fast=True`` when a cell fails remotely."""

    def __init__(self, failure: CellFailure) -> None:
        super().__init__(failure.format() + "\n" + failure.traceback)
        self.failure = failure


def _error_text(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class FactoryCache:
    """A small LRU of :class:`EpisodeFactory` objects by ``Cell.factory_config``.

    A worker process that runs cells of several factories in turn (a process pool, a Ray
    worker) keeps one of these so that a factory's caches outlive a single unit of work.
    """

    def __init__(self, size: int = 4) -> None:
        self.size = max(1, size)
        self._items: OrderedDict[EpisodeConfig, EpisodeFactory] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, config: EpisodeConfig) -> EpisodeFactory:
        factory = self._items.get(config)
        if factory is not None:
            self._items.move_to_end(config)
            self.hits += 1
            return factory
        self.misses += 1
        factory = self._items[config] = EpisodeFactory(config)
        while len(self._items) > self.size:
            self._items.popitem(last=False)
        return factory

    def __len__(self) -> int:
        return len(self._items)


def run_cells(cells: Sequence[Cell], timing: bool = True, *,
              factories: FactoryCache | None = None,
              catch: bool = False) -> list[dict[str, Any] | CellFailure]:
    """Run cells in order, sharing one factory among cells with equal configs.

    The picklable unit of work of the process-pool and Ray backends.

    Args:
        cells: the cells, best ordered so that cells sharing a factory are adjacent.
        timing: see :func:`run_cell`.
        factories: a factory cache to draw from (a fresh one-entry cache when None).
        catch: put a :class:`CellFailure` in the place of a cell that raises (an ``Exception``)
            and go on with the others; without it the first error propagates.
    """
    if factories is None:  # (not `or`: an empty cache is falsy)
        factories = FactoryCache(1)
    out: list[dict[str, Any] | CellFailure] = []
    for cell in cells:
        try:
            out.append(run_cell(cell, factories.get(cell.factory_config), timing=timing))
        except Exception as exc:
            if not catch:
                raise
            out.append(CellFailure.of(cell, exc))
    return out


# --------------------------------------------------------------------------------------------------
# Grids and experiments
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Grid:
    """The axes of an experiment. Cells are the product of every axis.

    Precedence of episode settings (later wins): the experiment's top-level episode keys
    (``base``), then ``per_trace[trace]``, then the swept axes (``loads``,
    ``estimation_errors``), then the variant's settings.

    Attributes:
        base: episode settings shared by every cell (the YAML's top-level episode keys).
        policies: policy names.
        clusters: cluster names or YAML paths (None: ``base.cluster``).
        traces: trace names or JSONL paths (None: ``base.trace``).
        seeds: episode seeds (None: ``base.seed``).
        loads: prefill utilisations ρ to sweep (None: the base / per-trace load).
        estimation_errors: estimation-error levels to sweep (None: the base level).
        per_trace: episode settings per trace name, e.g. ``{"lats": {"num_workflows": 100}}``.
        variants: named episode-setting overrides swept as one more axis, e.g.
            ``(("k32", {"max_calls_per_decision": 32}),)``.
        policy_kwargs: constructor arguments per policy name.
    """

    base: EpisodeConfig = field(default_factory=EpisodeConfig)
    policies: tuple[str, ...] = DEFAULT_POLICIES
    clusters: tuple[str, ...] | None = None
    traces: tuple[str, ...] | None = None
    seeds: tuple[int, ...] | None = None
    loads: tuple[float, ...] | None = None
    estimation_errors: tuple[float, ...] | None = None
    per_trace: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    variants: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    policy_kwargs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.policies:
            raise ConfigError("grid.policies must list at least one policy")
        known = policy_names()
        for p in self.policies:
            if p.lower() not in known:
                raise ConfigError(f"grid.policies: unknown policy '{p}'; known policies: "
                                  f"{', '.join(known)}.{suggest(p.lower(), known)}")
        for name in ("clusters", "traces", "seeds", "loads", "estimation_errors"):
            v = getattr(self, name)
            if v is not None and len(v) == 0:
                raise ConfigError(f"grid.{name} must not be empty (leave it out to use the "
                                  f"top-level value)")

    def cells(self) -> list[Cell]:
        """Every cell, ordered so cells sharing a factory are adjacent (seeds, then policies)."""
        base = self.base
        out: list[Cell] = []
        for variant, changes in self.variants or (("", {}),):
            for cluster in self.clusters or (base.cluster,):
                for trace in self.traces or (base.trace,):
                    per = dict(self.per_trace.get(trace, {}))
                    for load in self.loads or (None,):
                        for err in self.estimation_errors or (None,):
                            settings: dict[str, Any] = {"cluster": cluster, "trace": trace, **per}
                            if load is not None:
                                settings.update(load=load, arrival_rate=None)
                            if err is not None:
                                settings["estimation_error"] = err
                            settings.update(changes)
                            episode = base.replace(**settings)
                            for seed in self.seeds or (base.seed,):
                                for policy in self.policies:
                                    kwargs = self.policy_kwargs.get(policy.lower(), {})
                                    out.append(Cell(policy.lower(), episode.replace(seed=seed),
                                                    _freeze(kwargs), variant))
        return out


@dataclass(frozen=True)
class Report:
    """What the tables show.

    Attributes:
        metrics: per-cell metrics tabulated (columns), from :data:`METRICS`.
        reference: the policy whose reduction against the baselines is reported.
        baselines: the policies whose best (lowest seed-mean) sets the reduction.
        overhead: also print the scheduler-overhead table (ms per invocation, totals).
        by_size: also split Req95/Req99 by workflow size: workflows with at most this many calls
            against the larger ones (None: no split).
    """

    metrics: tuple[str, ...] = ("req95", "req99")
    reference: str = "hexagent"
    baselines: tuple[str, ...] = DEFAULT_BASELINES
    overhead: bool = False
    by_size: int | None = None

    def __post_init__(self) -> None:
        for m in self.metrics:
            if m not in METRICS:
                raise ConfigError(f"report.metrics: unknown metric '{m}'; known: "
                                  f"{', '.join(METRICS)}.{suggest(m, list(METRICS))}")
        if self.by_size is not None and (not isinstance(self.by_size, int)
                                         or isinstance(self.by_size, bool) or self.by_size < 1):
            raise ConfigError(f"report.by_size must be an integer >= 1 or null, got "
                              f"{self.by_size!r}")


@dataclass(frozen=True)
class Experiment:
    """A named grid plus its report settings."""

    name: str
    grid: Grid
    report: Report = field(default_factory=Report)
    description: str = ""
    source: str = "<defaults>"

    def cells(self) -> list[Cell]:
        return self.grid.cells()

    def with_overrides(self, *, policies: Sequence[str] | None = None,
                       clusters: Sequence[str] | None = None,
                       traces: Sequence[str] | None = None,
                       seeds: Sequence[int] | None = None,
                       num_workflows: int | None = None,
                       loads: Sequence[float] | None = None,
                       estimation_errors: Sequence[float] | None = None,
                       quick: bool = False, quick_workflows: int = 50) -> Experiment:
        """A copy with command-line style overrides applied (None leaves an axis as it is).

        ``num_workflows`` replaces the count everywhere (top level, per trace and variants).
        ``quick`` keeps the first seed only and caps every workflow count at ``quick_workflows``.
        """
        g = self.grid
        changes: dict[str, Any] = {}
        for name, value in (("policies", policies), ("clusters", clusters), ("traces", traces),
                            ("seeds", seeds), ("loads", loads),
                            ("estimation_errors", estimation_errors)):
            if value is not None:
                changes[name] = tuple(value)
        if policies is not None:
            changes["policies"] = tuple(p.lower() for p in policies)
        g = dataclasses.replace(g, **changes)  # Grid.__post_init__ checks the policy names

        def counts(fn: Callable[[int | None], int | None]) -> Grid:
            per = {t: {**s, "num_workflows": fn(s["num_workflows"])} if "num_workflows" in s
                   else dict(s) for t, s in g.per_trace.items()}
            variants = tuple((n, {**s, "num_workflows": fn(s["num_workflows"])}
                              if "num_workflows" in s else dict(s)) for n, s in g.variants)
            return dataclasses.replace(g, base=g.base.replace(
                num_workflows=fn(g.base.num_workflows)), per_trace=per, variants=variants)

        if num_workflows is not None:
            g = counts(lambda _n: num_workflows)
        if quick:
            g = counts(lambda n: quick_workflows if n is None else min(n, quick_workflows))
            g = dataclasses.replace(g, seeds=(g.seeds or (g.base.seed,))[:1])
        # Validate every cell's episode settings now, not halfway through a run.
        g.cells()
        return dataclasses.replace(self, grid=g)


def load_experiment(config: str | Path | Mapping[str, Any] | None = None) -> Experiment:
    """Read an experiment: a shipped name (``table1``), a YAML path, a mapping or None.

    Top-level keys are :class:`~hexagent_gym.episode.EpisodeConfig` fields (the settings every
    cell starts from) plus ``name``, ``description``, ``grid`` and ``report``; the schema is in
    ``docs/evaluation.md``. Errors name the file and the key.

    Raises:
        ConfigError: unknown or ill-typed keys, unknown policies, clusters or traces.
    """
    base, rest, source = load_config(config)
    for k in rest:
        if k not in TOP_LEVEL_KEYS:
            known = list(TOP_LEVEL_KEYS) + list(EPISODE_KEYS)
            raise ConfigError(f"{source}: unknown key '{k}'; known keys: {', '.join(known)}."
                              f"{suggest(k, known)}")
    name = rest.get("name")
    if name is None:
        name = Path(source).stem if source.endswith((".yaml", ".yml")) else "experiment"
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{source}: key 'name' must be a non-empty string, got {name!r}")
    description = rest.get("description") or ""
    if not isinstance(description, str):
        raise ConfigError(f"{source}: key 'description' must be a string, got {description!r}")
    grid = _parse_grid(rest.get("grid") or {}, base, source)
    report = _parse_report(rest.get("report") or {}, source)
    try:
        grid.cells()
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return Experiment(name, grid, report, description.strip(), source)


def _parse_grid(data: Any, base: EpisodeConfig, source: str) -> Grid:
    where = f"{source}: grid"
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a mapping of axis lists, got {type(data).__name__}")
    _check_keys(data, GRID_KEYS, where)
    kw: dict[str, Any] = {"base": base}
    if "policies" in data:
        kw["policies"] = tuple(p.lower() for p in _str_list(data, "policies", where))
    if "clusters" in data:
        kw["clusters"] = _str_list(data, "clusters", where)
        for c in kw["clusters"]:
            try:
                resolve_config("clusters", c)
            except ConfigError as exc:
                raise ConfigError(f"{where}.clusters: {exc}") from None
    if "traces" in data:
        kw["traces"] = _str_list(data, "traces", where)
        for t in kw["traces"]:
            _check_trace(t, f"{where}.traces")
    if "seeds" in data:
        kw["seeds"] = _num_list(data, "seeds", where, int)
    if "loads" in data:
        kw["loads"] = _num_list(data, "loads", where, float)
    if "estimation_errors" in data:
        kw["estimation_errors"] = _num_list(data, "estimation_errors", where, float)
    traces = kw.get("traces") or (base.trace,)
    per = data.get("per_trace") or {}
    if not isinstance(per, Mapping):
        raise ConfigError(f"{where}.per_trace must map trace names to settings, got "
                          f"{type(per).__name__}")
    per_trace = {}
    for t, settings in per.items():
        if t not in traces:
            raise ConfigError(f"{where}.per_trace: '{t}' is not one of the grid's traces "
                              f"({', '.join(traces)}).{suggest(str(t), list(traces))}")
        per_trace[t] = _settings(settings, f"{where}.per_trace.{t}", base)
    variants = []
    raw_variants = data.get("variants") or {}
    if not isinstance(raw_variants, Mapping):
        raise ConfigError(f"{where}.variants must map variant names to episode settings, got "
                          f"{type(raw_variants).__name__}")
    for vname, settings in raw_variants.items():
        variants.append((str(vname), _settings(settings or {}, f"{where}.variants.{vname}",
                                               base)))
    kwargs = data.get("policy_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise ConfigError(f"{where}.policy_kwargs must map policy names to arguments")
    policy_kwargs = {}
    for pname, args in kwargs.items():
        if not isinstance(args, Mapping):
            raise ConfigError(f"{where}.policy_kwargs.{pname} must be a mapping of arguments")
        try:
            make_policy(str(pname), **args)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}.policy_kwargs.{pname}: {exc}") from None
        policy_kwargs[str(pname).lower()] = dict(args)
    kw.update(per_trace=per_trace, variants=tuple(variants), policy_kwargs=policy_kwargs)
    try:
        return Grid(**kw)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _parse_report(data: Any, source: str) -> Report:
    where = f"{source}: report"
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a mapping, got {type(data).__name__}")
    _check_keys(data, REPORT_KEYS, where)
    kw: dict[str, Any] = {}
    if "metrics" in data:
        kw["metrics"] = _str_list(data, "metrics", where)
    if "reference" in data:
        if not isinstance(data["reference"], str):
            raise ConfigError(f"{where}.reference must be a policy name")
        kw["reference"] = data["reference"].lower()
    if "baselines" in data:
        kw["baselines"] = tuple(b.lower() for b in _str_list(data, "baselines", where))
    if "overhead" in data:
        if not isinstance(data["overhead"], bool):
            raise ConfigError(f"{where}.overhead must be true or false, got {data['overhead']!r}")
        kw["overhead"] = data["overhead"]
    if "by_size" in data:
        kw["by_size"] = data["by_size"]
    known = policy_names()
    for p in ([kw["reference"]] if "reference" in kw else []) + list(kw.get("baselines", ())):
        if p not in known:
            raise ConfigError(f"{where}: unknown policy '{p}'; known: {', '.join(known)}."
                              f"{suggest(p, known)}")
    try:
        return Report(**kw)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _check_keys(data: Mapping[str, Any], known: Sequence[str], where: str) -> None:
    for k in data:
        if k not in known:
            raise ConfigError(f"{where}: unknown key '{k}'; known keys: {', '.join(known)}."
                              f"{suggest(str(k), list(known))}")


def _str_list(data: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    v = data[key]
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
        raise ConfigError(f"{where}.{key} must be a non-empty list of strings, got {v!r}")
    return tuple(v)


def _num_list(data: Mapping[str, Any], key: str, where: str, kind: type) -> tuple[Any, ...]:
    v = data[key]
    if isinstance(v, int | float) and not isinstance(v, bool):
        v = [v]
    ok = isinstance(v, list) and v and all(
        isinstance(x, int if kind is int else int | float) and not isinstance(x, bool) for x in v)
    if not ok:
        raise ConfigError(f"{where}.{key} must be a non-empty list of "
                          f"{'integers' if kind is int else 'numbers'}, got {v!r}")
    return tuple(kind(x) for x in v)


def _settings(data: Any, where: str, base: EpisodeConfig) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a mapping of episode settings, got "
                          f"{type(data).__name__}")
    _check_keys(data, _SETTABLE, where)
    try:
        base.replace(**data)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return dict(data)


def _check_trace(name: str, where: str) -> None:
    from hexagent_gym.workload import TraceError, load_trace

    try:
        load_trace(name)  # cached by the loader; the cells load it again for free
    except TraceError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _freeze(kwargs: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    def frozen(v: Any) -> Any:
        if isinstance(v, list | tuple):
            return tuple(frozen(x) for x in v)
        if isinstance(v, Mapping):
            return tuple(sorted((str(k), frozen(x)) for k, x in v.items()))
        return v
    return tuple(sorted((str(k), frozen(v)) for k, v in kwargs.items()))


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple | list):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    return v


# --------------------------------------------------------------------------------------------------
# Running a grid with incremental, resumable output
# --------------------------------------------------------------------------------------------------

CELLS_FILE = "cells.jsonl"
RESULTS_FILE = "results.json"
FAILURES_FILE = "failures.jsonl"
BACKENDS = ("local", "ray")
"""``local``: this process, or a process pool with ``workers > 1``; ``ray``: Ray tasks
(:mod:`hexagent_gym.distributed`, needs ``pip install "hexagent-gym[distributed]"``)."""


@dataclass
class Evaluation:
    """Records of an experiment's finished cells, in grid order, plus how many were
    (re)computed and the cells that failed (:class:`CellFailure`, absent from ``records``)."""

    experiment: Experiment
    records: list[dict[str, Any]]
    computed: int = 0
    reused: int = 0
    wall_seconds: float = 0.0
    failures: list[CellFailure] = field(default_factory=list)
    backend: str = "local"

    @property
    def complete(self) -> bool:
        """True when every cell of the grid has a record (no failures)."""
        return not self.failures

    def summary(self) -> list[Row]:
        return summarize(self.records, self.experiment.report)


def read_cells(path: str | Path) -> dict[str, dict[str, Any]]:
    """Finished cell records of a ``cells.jsonl`` file, by cell key.

    A truncated last line (an interrupted write) is ignored; records of another schema version
    are skipped (their keys differ anyway).
    """
    path = Path(path)
    out: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return out
    with path.open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and rec.get("schema") == RECORD_SCHEMA and "key" in rec:
                out[rec["key"]] = rec
    return out


def format_failures(failures: Sequence[CellFailure], total: int | None = None) -> str:
    """The failure report: a header line, then each failed cell's parameters and error."""
    of = f" of {total}" if total is not None else ""
    lines = [f"{len(failures)}{of} cells failed; the other cells' records are kept. Run again "
             f"with --resume (resume=True) to retry only these:"]
    lines += [f.format() for f in failures]
    return "\n".join(lines)


def evaluate(experiment: Experiment, out_dir: str | Path | None = None, *, resume: bool = False,
             workers: int | None = None, progress: bool = True, timing: bool = True,
             backend: str = "local", address: str | None = None,
             chunk_size: int | None = None, fail_fast: bool = False,
             on_record: Callable[[dict[str, Any]], None] | None = None,
             ray_init: Mapping[str, Any] | None = None) -> Evaluation:
    """Run an experiment's cells and collect their records.

    Every backend gives the same records (apart from the wall-clock ``timing`` blocks): a cell's
    record is a function of the cell only, and records are returned in grid order whatever the
    order they finish in.

    Args:
        experiment: the experiment (:func:`load_experiment`).
        out_dir: where ``cells.jsonl`` grows one line per finished cell, flushed as it finishes
            (None: keep in memory). Failed cells go to ``failures.jsonl`` (parameters, error,
            traceback).
        resume: keep the finished cells already in ``out_dir/cells.jsonl`` and run only the
            rest (failed cells included); without it the file is started afresh.
        workers: ``local``: processes to run cells in (None or 1 = this process; cells sharing a
            factory go to one worker as a chunk, and groups are cut into smaller chunks when
            there are fewer than two per worker: :func:`auto_chunk_size`). ``ray`` without
            ``address``: CPUs of the local Ray instance started here (None: every core).
        progress: show a tqdm progress bar over cells.
        timing: record wall-clock timings (see :func:`run_cell`).
        backend: one of :data:`BACKENDS`.
        address: ``ray`` only: join this running Ray cluster (``HOST:6379``, ``auto``,
            ``ray://HOST:10001``) instead of starting a local instance.
        chunk_size: ``ray`` only: cells per Ray task, cut from the cells of one factory (0:
            whole factory groups; None: whole groups unless there are fewer than two per
            cluster CPU, :func:`auto_chunk_size`).
        fail_fast: stop at the first failing cell (``local`` serial: its exception propagates;
            otherwise :class:`CellError`). Without it a failing cell becomes a
            :class:`CellFailure` in ``Evaluation.failures`` and the other cells run on.
        on_record: called with each finished record right after it is written.
        ray_init: extra keyword arguments for ``ray.init`` (e.g. ``runtime_env``).
    """
    from tqdm.auto import tqdm

    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    if backend != "ray" and (address is not None or ray_init):
        raise ValueError("address and ray_init apply to backend='ray' only")
    if backend == "ray":  # fail before touching cells.jsonl
        from hexagent_gym.distributed import check_reachable, require_ray

        require_ray()
        if address:
            check_reachable(address)
    start = time.perf_counter()
    cells = experiment.cells()
    keys = [c.key for c in cells]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"{experiment.source}: the grid lists the same cell twice (a duplicated "
                          f"policy, seed, load or variant?)")
    done: dict[str, dict[str, Any]] = {}
    sink = None
    failures_path = None
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        path = out / CELLS_FILE
        if resume:
            done = {k: r for k, r in read_cells(path).items() if k in set(keys)}
            if not timing:
                done = {k: {f: v for f, v in r.items() if f != "timing"} for k, r in done.items()}
            _rewrite_clean(path)
        else:
            path.write_text("", encoding="utf-8")
        sink = path.open("a", encoding="utf-8")
        failures_path = out / FAILURES_FILE
        failures_path.unlink(missing_ok=True)  # this run retries every cell that failed before
    todo = [c for c in cells if c.key not in done]
    reused = len(cells) - len(todo)
    failures: list[CellFailure] = []
    bar = tqdm(total=len(todo), disable=not progress, unit="cell", dynamic_ncols=True)
    try:
        def finish(rec: dict[str, Any]) -> None:
            done[rec["key"]] = rec
            if sink is not None:
                sink.write(json.dumps(rec, separators=(",", ":")) + "\n")
                sink.flush()
            bar.update(1)
            if on_record is not None:
                on_record(rec)

        def fail(failure: CellFailure) -> None:
            failures.append(failure)
            if failures_path is not None:
                with failures_path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(failure.to_dict(), separators=(",", ":")) + "\n")
            bar.set_description_str(f"{len(failures)} failed", refresh=False)
            bar.update(1)
            if fail_fast:
                raise CellError(failure)

        groups = list(_groups(todo))
        workers_n = 1 if workers is None else workers
        if backend == "ray":
            from hexagent_gym.distributed import ray_outcomes

            outcomes: Iterator[dict[str, Any] | CellFailure] = ray_outcomes(
                groups, timing=timing, address=address, num_cpus=workers,
                chunk_size=chunk_size, init_kwargs=ray_init)
        elif workers_n <= 1:
            outcomes = _serial_outcomes(groups, timing, catch=not fail_fast, bar=bar)
        else:
            outcomes = _pool_outcomes(groups, timing, workers_n)
        with contextlib.closing(outcomes):
            for outcome in outcomes:
                if isinstance(outcome, CellFailure):
                    fail(outcome)
                else:
                    finish(outcome)
    finally:
        bar.close()
        if sink is not None:
            sink.close()
    records = [done[k] for k in keys if k in done]
    order = {k: i for i, k in enumerate(keys)}
    failures.sort(key=lambda f: order[f.key])
    return Evaluation(experiment, records, computed=len(todo) - len(failures), reused=reused,
                      wall_seconds=time.perf_counter() - start, failures=failures,
                      backend=backend)


def _serial_outcomes(groups: Sequence[list[Cell]], timing: bool, *, catch: bool,
                     bar: Any) -> Iterator[dict[str, Any] | CellFailure]:
    cache = FactoryCache(1)
    for group in groups:
        for cell in group:
            bar.set_postfix_str(cell.describe(), refresh=False)
            yield from run_cells([cell], timing, factories=cache, catch=catch)


TASKS_PER_CPU = 2
"""Automatic chunking cuts a grid into at least this many tasks per worker CPU."""
FACTORY_CACHE_SIZE = 4
"""Factories a worker process keeps across tasks (least recently used dropped first)."""
_process_factories: FactoryCache | None = None  # per worker process, built on first use


def chunk_cells(groups: Sequence[Sequence[Cell]], chunk_size: int | None) -> list[list[Cell]]:
    """Split every factory group into near-equal consecutive chunks of at most ``chunk_size``
    cells (0 or None: one chunk per group), keeping the groups' order."""
    out: list[list[Cell]] = []
    for group in groups:
        group = list(group)
        if not group:
            continue
        if not chunk_size or chunk_size >= len(group):
            out.append(group)
            continue
        pieces = math.ceil(len(group) / chunk_size)
        bounds = [round(i * len(group) / pieces) for i in range(pieces + 1)]
        out += [group[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    return out


def auto_chunk_size(groups: Sequence[Sequence[Cell]], cpus: float,
                    tasks_per_cpu: int = TASKS_PER_CPU) -> int:
    """The chunk size of ``chunk_size=None``: whole factory groups (0) when there are at least
    ``tasks_per_cpu`` groups per CPU, else the size that cuts the grid into about that many
    tasks. Whole groups build each factory once; smaller chunks keep every CPU busy when the
    groups are few or uneven (measurements: docs/distributed.md)."""
    target = max(1, int(tasks_per_cpu * max(1.0, cpus)))
    if len(groups) >= target:
        return 0
    return max(1, math.ceil(sum(len(g) for g in groups) / target))


def run_chunk(cells: Sequence[Cell], timing: bool = True) -> list[dict[str, Any] | CellFailure]:
    """The body of one task (a local pool job or a Ray task): run the cells with this process's
    factory cache, turning a cell that raises into a :class:`CellFailure`."""
    global _process_factories
    if _process_factories is None:
        _process_factories = FactoryCache(FACTORY_CACHE_SIZE)
    return run_cells(cells, timing, factories=_process_factories, catch=True)


def _pool_outcomes(groups: Sequence[list[Cell]], timing: bool,
                   workers: int) -> Iterator[dict[str, Any] | CellFailure]:
    # Whole factory groups share one factory build, but a grid with fewer groups than workers
    # (one cluster and trace, many seeds) would leave workers idle: cut groups into chunks then.
    chunks = chunk_cells(groups, auto_chunk_size(groups, workers))
    pool = ProcessPoolExecutor(max_workers=workers)
    futures = {pool.submit(run_chunk, c, timing): c for c in chunks}
    try:
        for fut in as_completed(futures):
            try:
                outs = fut.result()
            except Exception as exc:  # the worker died (BrokenProcessPool) or did not unpickle
                outs = [CellFailure.of(c, exc) for c in futures[fut]]
            yield from outs
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _groups(cells: Iterable[Cell]) -> Iterator[list[Cell]]:
    groups: dict[EpisodeConfig, list[Cell]] = {}
    for c in cells:
        groups.setdefault(c.factory_config, []).append(c)
    yield from groups.values()


def _rewrite_clean(path: Path) -> None:
    """Drop a truncated last line so appended records start on a line of their own."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


# --------------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------------

# Two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile_975(df: int) -> float:
    """t_{0.975, df} (tabulated up to 30 degrees of freedom, conservative steps beyond)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= 30:
        return _T975[df - 1]
    return 2.021 if df < 60 else 2.000 if df < 120 else 1.980 if df < 1000 else 1.960


@dataclass(frozen=True)
class Stat:
    """Mean of a metric over seeds with the half-width of its 95% confidence interval.

    ``ci`` is ``t_{0.975, n−1} · s / √n`` (s the sample standard deviation over seeds); NaN
    when n = 1.
    """

    mean: float
    ci: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        v = np.asarray(values, dtype=np.float64)
        n = len(v)
        if n == 0:
            return cls(math.nan, math.nan, 0)
        if n == 1:
            return cls(float(v[0]), math.nan, 1)
        return cls(float(v.mean()), t_quantile_975(n - 1) * float(v.std(ddof=1)) / math.sqrt(n),
                   n)

    def format(self, digits: int = 2) -> str:
        if math.isnan(self.mean):
            return "–"
        if math.isnan(self.ci):
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.ci:.{digits}f}"


@dataclass
class Row:
    """One table row: cells equal in everything but policy and seed.

    Attributes:
        episode: the row's episode settings (seed dropped).
        variant: the grid variant ("" when none).
        offered_load: prefill utilisation ρ of the row's arrival rate (None when replaying).
        arrival_rate: workflows per second (None when replaying).
        stats: metric statistics per policy: ``stats[policy][metric]``.
        records: the row's cell records per policy, in seed order.
        best: per metric, the baseline with the lowest mean (None without baselines).
        reduction: per metric, ``1 − mean(reference) / mean(best baseline)``; positive means
            the reference is lower (better). None without the reference or baselines.
        paired: per metric, the per-seed reductions ``1 − reference_s / best_s`` (seeds run by
            both) as a :class:`Stat`: the workload of a seed is the same for every policy, so
            this pairs out the seed-to-seed variation that widens the per-policy intervals.
    """

    episode: dict[str, Any]
    variant: str
    offered_load: float | None
    arrival_rate: float | None
    stats: dict[str, dict[str, Stat]] = field(default_factory=dict)
    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    best: dict[str, str | None] = field(default_factory=dict)
    reduction: dict[str, float | None] = field(default_factory=dict)
    paired: dict[str, Stat | None] = field(default_factory=dict)

    @property
    def policies(self) -> list[str]:
        return list(self.stats)

    def to_dict(self) -> dict[str, Any]:
        return {
            "episode": self.episode, "variant": self.variant, "offered_load": self.offered_load,
            "arrival_rate": self.arrival_rate,
            "stats": {p: {m: {"mean": s.mean, "ci95": s.ci, "n": s.n} for m, s in ms.items()}
                      for p, ms in self.stats.items()},
            "seeds": {p: [r["cell"]["episode"]["seed"] for r in rs]
                      for p, rs in self.records.items()},
            "best_baseline": self.best, "reduction": self.reduction,
            "paired_reduction": {m: None if s is None else {"mean": s.mean, "ci95": s.ci,
                                                            "n": s.n}
                                 for m, s in self.paired.items()},
        }


def row_key(record: Mapping[str, Any]) -> str:
    """Identity of a record's table row: its episode settings without the seed, plus variant."""
    episode = {k: v for k, v in record["cell"]["episode"].items() if k != "seed"}
    return json.dumps({"episode": episode, "variant": record["cell"]["variant"]}, sort_keys=True)


def summarize(records: Sequence[Mapping[str, Any]], report: Report | None = None) -> list[Row]:
    """Group records into rows (first-appearance order) and compute the statistics.

    Each metric of each policy is averaged over the row's seeds (:class:`Stat`). The best
    baseline is the one of ``report.baselines`` present in the row with the lowest mean; the
    reduction compares the reference policy's mean with it.
    """
    report = report or Report()
    rows: dict[str, Row] = {}
    for rec in records:
        key = row_key(rec)
        row = rows.get(key)
        if row is None:
            episode = {k: v for k, v in rec["cell"]["episode"].items() if k != "seed"}
            row = rows[key] = Row(episode, rec["cell"]["variant"], rec.get("offered_load"),
                                  rec.get("arrival_rate"))
        row.records.setdefault(rec["cell"]["policy"], []).append(rec)
    for row in rows.values():
        for policy, recs in row.records.items():
            recs.sort(key=lambda r: r["cell"]["episode"]["seed"])
            # records written before a metric existed (resumed runs) lack it: NaN
            row.stats[policy] = {m: Stat.of([r["metrics"].get(m, math.nan) for r in recs])
                                 for m in METRICS}
        for m in SLO_METRICS:
            present = [b for b in report.baselines if b in row.stats and b != report.reference]
            best = min(present, key=lambda b: row.stats[b][m].mean) if present else None
            row.best[m] = best
            ref = row.stats.get(report.reference)
            if best is None or ref is None or not row.stats[best][m].mean > 0:
                row.reduction[m] = row.paired[m] = None
                continue
            row.reduction[m] = 1.0 - ref[m].mean / row.stats[best][m].mean
            by_seed = {r["cell"]["episode"]["seed"]: r["metrics"][m]
                       for r in row.records[best]}
            row.paired[m] = Stat.of([1.0 - r["metrics"][m] / by_seed[s]
                                     for r in row.records[report.reference]
                                     if (s := r["cell"]["episode"]["seed"]) in by_seed])
    return list(rows.values())


def mean_reduction(rows: Sequence[Row], metric: str) -> float | None:
    """Average over rows of the reference's reduction against the best baseline (as the paper
    averages its per-setting reductions); None when no row has one."""
    vals = [r.reduction.get(metric) for r in rows]
    vals = [v for v in vals if v is not None]
    return float(np.mean(vals)) if vals else None


def _varying(rows: Sequence[Row], name: str) -> bool:
    return len({json.dumps(r.episode.get(name)) for r in rows}) > 1


def _row_label_columns(rows: Sequence[Row], compact: bool = False
                       ) -> list[tuple[str, Callable[[Row], str]]]:
    """Columns that identify a row; ``compact`` keeps size and load only where they vary."""
    cols: list[tuple[str, Callable[[Row], str]]] = [
        ("cluster", lambda r: str(r.episode["cluster"])),
        ("trace", lambda r: str(r.episode["trace"])),
        ("n", lambda r: "all" if r.episode["num_workflows"] is None
         else str(r.episode["num_workflows"])),
        ("ρ", lambda r: "–" if r.offered_load is None else f"{r.offered_load:.2f}"),
        ("λ (wf/s)", lambda r: "trace" if r.arrival_rate is None else f"{r.arrival_rate:.3g}"),
    ]
    if compact:
        cols = cols[:2]
        if _varying(rows, "num_workflows"):
            cols.append(("n", lambda r: str(r.episode["num_workflows"])))
        if len({r.offered_load for r in rows}) > 1 or len({r.arrival_rate for r in rows}) > 1:
            cols.append(("ρ", lambda r: "–" if r.offered_load is None
                         else f"{r.offered_load:.2f}"))
    if _varying(rows, "estimation_error"):
        cols.append(("est. err", lambda r: f"{r.episode['estimation_error']:g}"))
    for name in ("planning_latency", "max_calls_per_decision"):
        if _varying(rows, name):
            cols.append((name, lambda r, n=name: str(r.episode[n])))
    if any(r.variant for r in rows):
        cols.append(("variant", lambda r: r.variant or "–"))
    return cols


def _markdown(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def format_table(rows: Sequence[Row], metric: str, report: Report | None = None,
                 policies: Sequence[str] | None = None, digits: int = 2) -> str:
    """A markdown table of one metric: a column per policy (mean ± 95% CI over seeds), the best
    baseline, the reference's reduction against it (positive = the reference is lower) and,
    with several seeds, the paired per-seed reduction (mean ± 95% CI, percentage points)."""
    report = report or Report()
    if policies is None:
        policies = []
        for r in rows:
            policies += [p for p in r.policies if p not in policies]
    labels = _row_label_columns(rows)
    with_red = any(r.reduction.get(metric) is not None for r in rows)
    header = [n for n, _ in labels] + list(policies)
    paired = with_red and any(r.paired.get(metric) is not None and r.paired[metric].n > 1
                              for r in rows)
    if with_red:
        header += ["best baseline", f"{report.reference} reduction"]
    if paired:
        header += ["paired per-seed reduction"]
    body = []
    for r in rows:
        line = [fn(r) for _, fn in labels]
        line += [r.stats[p][metric].format(digits) if p in r.stats else "–" for p in policies]
        if with_red:
            line += [r.best.get(metric) or "–", _pct(r.reduction.get(metric))]
        if paired:
            st = r.paired.get(metric)
            line.append("–" if st is None else _pct(st.mean) if math.isnan(st.ci)
                        else f"{_pct(st.mean)} ± {100 * st.ci:.1f}")
        body.append(line)
    return _markdown(header, body)


def format_overhead(rows: Sequence[Row]) -> str:
    """Scheduler overhead per row and policy: invocations, ms per invocation (mean, median and
    99th percentile over invocations, averaged over seeds), scheduler seconds and wall seconds
    per episode.

    The scheduler time of an invocation runs from opening the decision point (building the
    simulated state Ŝ) to applying its plan, so it includes the projections every policy sees.
    The episode wall time is the whole ``run_policy`` call (simulation plus scheduling)."""
    labels = _row_label_columns(rows, compact=True)
    header = [n for n, _ in labels] + ["policy", "calls", "invocations", "ms/inv (mean)",
                                       "ms/inv (median)", "ms/inv (p99)", "scheduler s/episode",
                                       "episode wall s"]
    body = []
    for r in rows:
        for policy, recs in r.records.items():
            timed = [x["timing"] for x in recs if "timing" in x]

            def avg(name: str, recs: list = timed) -> str:
                vals = [t[name] for t in recs if name in t]
                return f"{np.mean(vals):.3f}" if vals else "–"

            body.append([fn(r) for _, fn in labels] + [
                policy, f"{np.mean([x['metrics']['num_calls'] for x in recs]):.0f}",
                f"{np.mean([x['metrics']['invocations'] for x in recs]):.0f}",
                avg("scheduler_ms_per_invocation"), avg("scheduler_ms_median"),
                avg("scheduler_ms_p99"), avg("scheduler_seconds"), avg("cell_seconds")])
    return _markdown(header, body)


def size_split(record: Mapping[str, Any], max_calls: int) -> dict[str, dict[str, float]]:
    """Req95/Req99 of a cell's small workflows (≤ ``max_calls`` calls) and large ones."""
    wf = record["workflows"]
    ratios = np.asarray(wf["ratio"], dtype=np.float64)
    calls = np.asarray(wf["num_calls"])
    out = {}
    for name, mask in (("small", calls <= max_calls), ("large", calls > max_calls)):
        r = ratios[mask]
        out[name] = {"n": int(mask.sum()), "req95": req(r, 0.95), "req99": req(r, 0.99)}
    return out


def format_by_size(rows: Sequence[Row], max_calls: int) -> str:
    """Req95/Req99 of small (≤ ``max_calls`` calls) and large workflows, mean over seeds."""
    labels = _row_label_columns(rows, compact=True)
    header = [n for n, _ in labels] + ["policy", f"n (≤{max_calls} calls)", "Req95", "Req99",
                                       f"n (>{max_calls} calls)", "Req95", "Req99"]
    body = []
    for r in rows:
        for policy, recs in r.records.items():
            parts = [size_split(x, max_calls) for x in recs]
            line = [fn(r) for _, fn in labels] + [policy]
            for name in ("small", "large"):
                line.append(f"{np.mean([p[name]['n'] for p in parts]):.0f}")
                for m in ("req95", "req99"):
                    line.append(Stat.of([p[name][m] for p in parts]).format())
            body.append(line)
    return _markdown(header, body)


def report_text(evaluation: Evaluation) -> str:
    """Every table of an evaluation as markdown, with a caption per table."""
    exp = evaluation.experiment
    rep = exp.report
    rows = evaluation.summary()
    seeds = sorted({r["cell"]["episode"]["seed"] for r in evaluation.records})
    parts = [f"# {exp.name}"]
    if exp.description:
        parts.append(exp.description)
    ci = "mean ± 95% CI (Student t) over seeds" if len(seeds) > 1 else "one seed"
    parts.append(f"Seeds: {', '.join(map(str, seeds))} ({ci}). ρ = offered prefill load "
                 f"without prefix reuse (hexagent_gym.load), λ = arrival rate; prefill_load = "
                 f"ρ of the work actually computed (cache hits removed).")
    if evaluation.failures:
        parts.append(f"**Incomplete**: {len(evaluation.failures)} cells failed and are missing "
                     f"from these tables (their parameters and errors are in {FAILURES_FILE}):\n\n"
                     + "\n".join(f"- {f.description}: {f.error}" for f in evaluation.failures))
    for m in rep.metrics:
        parts.append(f"## {m}\n\n" + format_table(rows, m, rep))
        avg = mean_reduction(rows, m)
        if avg is not None:
            parts.append(f"Mean {rep.reference} reduction in {m} against the best of "
                         f"{', '.join(rep.baselines)}: {_pct(avg)} over {len(rows)} rows.")
    if rep.overhead:
        parts.append("## Scheduler overhead\n\n" + format_overhead(rows))
    if rep.by_size is not None:
        parts.append(f"## By workflow size (≤ {rep.by_size} calls vs more)\n\n"
                     + format_by_size(rows, rep.by_size))
    return "\n\n".join(parts) + "\n"


def results_json(evaluation: Evaluation) -> dict[str, Any]:
    """The whole evaluation as JSON-ready data: experiment, table rows and every cell record."""
    exp = evaluation.experiment
    rows = evaluation.summary()
    return {
        "experiment": exp.name,
        "description": exp.description,
        "source": exp.source,
        "report": _jsonable(dataclasses.asdict(exp.report)),
        "rows": [r.to_dict() for r in rows],
        "mean_reduction": {m: mean_reduction(rows, m) for m in METRICS},
        "cells": evaluation.records,
        **({"failures": [f.to_dict() for f in evaluation.failures]}
           if evaluation.failures else {}),
    }


def write_results(evaluation: Evaluation, out_dir: str | Path) -> list[Path]:
    """Write ``results.json`` (rows and cells, grid order) and ``tables.md``; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    res = out / RESULTS_FILE
    res.write_text(json.dumps(results_json(evaluation), indent=1) + "\n", encoding="utf-8")
    md = out / "tables.md"
    md.write_text(report_text(evaluation), encoding="utf-8")
    return [res, md]
