"""Cells: one episode of one policy, the pure function that runs it, and its failure record.

A :class:`Cell` holds only picklable parameters and :func:`run_cell` is a pure function of them
(same cell → same record, apart from the wall-clock ``timing`` block), so any backend can run
cells anywhere and in any order. Cells that share every episode parameter except the seed share
one :class:`~hexagent_gym.episode.EpisodeFactory`, whose cluster tables and standalone-horizon
cache are the expensive, seed-independent part; :class:`FactoryCache` keeps a few of them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
import traceback
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.policy import make_policy, run_policy
from hexagent_gym.sim.metrics import EpisodeResult

RECORD_SCHEMA = 1
"""Version of the cell record layout; part of every cell key, so a layout change re-runs cells."""

_FLOAT_FIELDS = ("arrival_rate", "load", "estimation_error", "planning_latency")


@dataclass(frozen=True)
class Cell:
    """One episode of one policy: everything :func:`run_cell` needs, and nothing else.

    Attributes:
        policy: registered policy name (``hexagent_gym.policy.policy_names``).
        episode: the episode (cluster, trace, workflows, load, seed, estimation error, ...).
        policy_kwargs: constructor arguments of the policy, as sorted (name, value) pairs.
        variant: name of the grid variant that produced the cell ("" when the grid has none).
        label: the policy's name in tables and figures when it differs from ``policy`` (a grid
            entry such as ``{name: atlas, label: atlas-noloc, kwargs: ...}``); "" means
            ``policy``. Part of :attr:`params` (and so of the key) only when set, so unlabelled
            cells keep the keys they always had.
    """

    policy: str
    episode: EpisodeConfig
    policy_kwargs: tuple[tuple[str, Any], ...] = ()
    variant: str = ""
    label: str = ""

    @property
    def params(self) -> dict[str, Any]:
        """The cell's parameters as canonical JSON-ready data (ints in float fields are floats)."""
        episode = dataclasses.asdict(self.episode)
        # recording a timeline changes no result: keep it out of the key, so cells recorded
        # before the option existed (and recorded runs) resume as the same cells
        episode.pop("record_timeline", None)
        if episode.get("faults") is None:  # cells without faults keep the keys they had
            episode.pop("faults", None)
        for k in _FLOAT_FIELDS:
            v = episode[k]
            if isinstance(v, int) and not isinstance(v, bool):
                episode[k] = float(v)
        labelled = {"label": self.label} if self.label else {}
        return {"policy": self.policy, **labelled,
                "policy_kwargs": jsonable(dict(self.policy_kwargs)),
                "variant": self.variant, "episode": episode}

    @property
    def key(self) -> str:
        """Stable id of the cell (hash of its parameters and the record schema)."""
        return params_key(self.params)

    @property
    def factory_config(self) -> EpisodeConfig:
        """The episode config without its seed: cells equal in it share one factory."""
        return self.episode.replace(seed=0)

    def describe(self) -> str:
        """One line: policy (label), cluster/trace, load, error, variant, seed."""
        e = self.episode
        load = f"ρ={e.load:g}" if e.arrival_rate is None and e.load is not None else (
            f"λ={e.arrival_rate:g}/s" if e.arrival_rate is not None else "replay")
        err = f" err={e.estimation_error:g}" if e.estimation_error else ""
        var = f" [{self.variant}]" if self.variant else ""
        who = f"{self.label} ({self.policy})" if self.label else self.policy
        return f"{who} {e.cluster}/{e.trace} {load}{err}{var} seed {e.seed}"


def params_key(params: Mapping[str, Any]) -> str:
    """The key of a cell with these :attr:`Cell.params` (a record's ``cell`` block): a hash of
    them and the record schema, so a record whose parameters were edited no longer matches."""
    text = json.dumps({"schema": RECORD_SCHEMA, **params}, sort_keys=True,
                      separators=(",", ":"))
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def policy_label(cell_params: Mapping[str, Any]) -> str:
    """The name a record's policy goes by in tables and figures: its label, else its policy.

    Args:
        cell_params: a record's ``cell`` block (:attr:`Cell.params`).
    """
    return cell_params.get("label") or cell_params["policy"]


def cell_episode(cell: Cell, factory: EpisodeFactory | None = None, *,
                 record_timeline: bool = False) -> tuple[EpisodeResult, EpisodeFactory]:
    """Run one cell's episode (its policy with its arguments, on its seed) and return the
    simulator's result with the factory it used (``factory``, or one built here from
    ``cell.factory_config``). ``record_timeline`` records the episode's timeline (the result is
    otherwise the same).

    Raises:
        ValueError: ``factory`` was built for another episode configuration.
    """
    if factory is None:
        factory = EpisodeFactory(cell.factory_config)
    elif factory.config != cell.factory_config:
        raise ValueError(f"the factory was built for {factory.config}, not for this cell's "
                         f"episode {cell.factory_config}; build it from cell.factory_config")
    policy = make_policy(cell.policy, **dict(cell.policy_kwargs))
    sim = factory.simulator(cell.episode.seed, record_timeline=record_timeline)
    return run_policy(sim, policy, close=True), factory


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
    start = time.perf_counter()
    result, factory = cell_episode(cell, factory)
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
            "fault_events": result.fault_events,
            "fault_reexecuted_calls": result.fault_reexecuted_calls,
            "fault_recomputed_tokens": result.fault_recomputed_tokens,
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
        """The failure of ``cell`` raising ``exc`` (``tb``: a traceback formatted elsewhere)."""
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
    """Raised by ``evaluate`` with ``fail_fast=True`` when a cell fails remotely."""

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
        """The factory of ``config``, built (and the least recently used one dropped) if new."""
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


def freeze_kwargs(kwargs: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Constructor arguments as hashable sorted (name, value) pairs (lists become tuples,
    mappings sorted pairs): the form :attr:`Cell.policy_kwargs` takes."""
    def frozen(v: Any) -> Any:
        if isinstance(v, list | tuple):
            return tuple(frozen(x) for x in v)
        if isinstance(v, Mapping):
            return tuple(sorted((str(k), frozen(x)) for k, x in v.items()))
        return v
    return tuple(sorted((str(k), frozen(v)) for k, v in kwargs.items()))


def jsonable(v: Any) -> Any:
    """``v`` with tuples turned into lists, recursively through lists and dicts."""
    if isinstance(v, tuple | list):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    return v
