"""Instance faults as simulator events: the configuration model, its validation and the draws of
the MTBF/MTTR process (docs/faults.md). What a fault does to the running episode is
:mod:`hexagent_gym.sim.fault_flow`.

Four kinds of event, each on one instance (``prefill:<i>`` or ``decode:<i>``, the pool and the
0-based index in the cluster's listing order):

- ``fail``: the instance loses everything it holds (its running and queued work, the KV it holds
  or receives, its prefix cache) and is unavailable for ``duration`` seconds; the lost calls go
  back to waiting-prefill and are served again;
- ``drain``: no new work is placed on it for ``duration`` seconds; what it already runs, and what
  is already on its way to it, finishes there;
- ``slow``: the instance runs at ``factor`` times its speed for ``duration`` seconds (a
  straggler; 0.5 = half speed); schedulers are not told;
- recovery: the end of a fault's ``duration`` (a failed instance returns empty).

Faults come from an explicit list (``events``) and/or a seeded process: every instance of the
``pools`` alternates up-times drawn from Exp(mean ``mtbf``) and faults of a kind drawn uniformly
from ``kinds`` lasting Exp(mean ``mttr``). Each instance draws from its own generator seeded from
the episode seed, so the fault times are a function of the seed only: every policy of a cell
meets the same faults, and the same seed gives bit-identical results.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hexagent_gym.config import ConfigError, suggest

FAULT_KINDS = ("fail", "drain", "slow")
POOLS = ("prefill", "decode")
EVENT_KEYS = ("time", "instance", "kind", "duration", "factor")
FAULT_KEYS = ("events", "mtbf", "mttr", "kinds", "pools", "slow_factor", "start")
FAULT_STREAM = 0xFA17
"""Mixed into every fault generator's seed, so fault draws never share a stream with the
episode's own generator (the workload, arrivals and estimation errors stay as without faults)."""


@dataclass(frozen=True)
class FaultEvent:
    """One scheduled fault: ``kind`` on instance ``index`` of ``pool`` from ``time`` for
    ``duration`` seconds (``factor``: the speed of a ``slow`` fault, 1.0 otherwise)."""

    time: float
    pool: str
    index: int
    kind: str
    duration: float
    factor: float = 1.0

    @property
    def instance(self) -> str:
        return f"{self.pool}:{self.index}"


@dataclass(frozen=True)
class FaultProcess:
    """The MTBF/MTTR process: per instance of ``pools``, up-times ~ Exp(``mtbf``) from ``start``
    on, then a fault of a kind drawn uniformly from ``kinds`` lasting ~ Exp(``mttr``); a ``slow``
    fault runs at ``slow_factor``."""

    mtbf: float
    mttr: float
    kinds: tuple[str, ...] = ("fail",)
    pools: tuple[str, ...] = POOLS
    slow_factor: float = 0.5
    start: float = 0.0


@dataclass(frozen=True)
class FaultPlan:
    """An episode's faults: explicit ``events`` (in time order) and an optional ``process``.
    Hashable and picklable (it is part of :class:`~hexagent_gym.episode.EpisodeConfig`)."""

    events: tuple[FaultEvent, ...] = ()
    process: FaultProcess | None = None

    def check_cluster(self, num_prefill: int, num_decode: int, src: str) -> None:
        """Every event names an instance the cluster has.

        Raises:
            ConfigError: naming the event and the valid instances.
        """
        sizes = {"prefill": num_prefill, "decode": num_decode}
        for i, ev in enumerate(self.events):
            if ev.index >= sizes[ev.pool]:
                raise ConfigError(
                    f"{src}: faults.events[{i}].instance '{ev.instance}' does not exist: the "
                    f"cluster has prefill:0..{num_prefill - 1} and decode:0..{num_decode - 1}")


def _number(value: Any, where: str, *, positive: bool, upper: float | None = None) -> float:
    """A finite number (> 0 with ``positive``, else >= 0; <= ``upper`` when given)."""
    ok = (not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
          and (value > 0 if positive else value >= 0) and (upper is None or value <= upper))
    if not ok:
        bound = "> 0" if positive else ">= 0"
        top = f" and <= {upper:g}" if upper is not None else ""
        raise ConfigError(f"{where} must be a finite number {bound}{top}, got {value!r}")
    return float(value)


def _names(value: Any, options: tuple[str, ...], where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Sequence) or not value:
        raise ConfigError(f"{where} must be a non-empty list of {', '.join(options)}, got "
                          f"{value!r}")
    for v in value:
        if v not in options:
            raise ConfigError(f"{where}: unknown '{v}'; valid: {', '.join(options)}."
                              f"{suggest(str(v), list(options))}")
    return tuple(dict.fromkeys(value))  # de-duplicated, in the given order


def parse_instance(value: Any, where: str) -> tuple[str, int]:
    """``"prefill:3"`` / ``"decode:0"`` (or ``{pool, index}``) as (pool, index)."""
    if isinstance(value, Mapping):
        pool, index = value.get("pool"), value.get("index")
    elif isinstance(value, str) and value.count(":") == 1:
        pool, _, index = value.partition(":")
        index = int(index) if index.strip().isdigit() else index
    else:
        pool, index = None, None
    if pool not in POOLS or isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ConfigError(f"{where} must name an instance as 'prefill:<i>' or 'decode:<i>' "
                          f"(0-based index in the cluster's listing order), got {value!r}")
    return pool, index


def _check_keys(data: Any, keys: tuple[str, ...], where: str, what: str) -> None:
    """``data`` must be a mapping (``what`` says what else may stand there) with keys only
    among ``keys``; else a ConfigError naming ``where`` and the valid keys."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be {what} with keys {', '.join(keys)}, got {data!r}")
    for k in data:
        if k not in keys:
            raise ConfigError(f"{where}: unknown key '{k}'; known: {', '.join(keys)}."
                              f"{suggest(str(k), list(keys))}")


def _parse_event(data: Any, where: str) -> FaultEvent:
    _check_keys(data, EVENT_KEYS, where, "a mapping")
    for k in ("time", "instance", "kind", "duration"):
        if k not in data:
            raise ConfigError(f"{where}: missing key '{k}' (an event needs time, instance, kind "
                              f"and duration)")
    kind = data["kind"]
    if kind not in FAULT_KINDS:
        raise ConfigError(f"{where}.kind: unknown '{kind}'; valid: {', '.join(FAULT_KINDS)}."
                          f"{suggest(str(kind), list(FAULT_KINDS))}")
    if "factor" in data and kind != "slow":
        raise ConfigError(f"{where}.factor: only a 'slow' event has a speed factor, this one is "
                          f"'{kind}'")
    if kind == "slow" and "factor" not in data:
        raise ConfigError(f"{where}: a 'slow' event needs 'factor' (its speed, in (0, 1])")
    pool, index = parse_instance(data["instance"], f"{where}.instance")
    factor = (_number(data["factor"], f"{where}.factor", positive=True, upper=1.0)
              if kind == "slow" else 1.0)
    return FaultEvent(_number(data["time"], f"{where}.time", positive=False), pool, index, kind,
                      _number(data["duration"], f"{where}.duration", positive=True), factor)


def parse_faults(value: Any, src: str = "faults") -> FaultPlan | None:
    """An episode's ``faults`` setting (None, a :class:`FaultPlan`, or its mapping form) as a
    plan; None when it has no event and no process.

    Raises:
        ConfigError: an unknown key, a missing or ill-typed value (negative, infinite, NaN), an
            unknown kind or pool, naming ``src`` and the field.
    """
    if value is None or isinstance(value, FaultPlan):
        return value if value is None or value.events or value.process else None
    where = f"{src}: faults"
    _check_keys(value, FAULT_KEYS, where, "null or a mapping")
    raw = value.get("events") or []
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise ConfigError(f"{where}.events must be a list of events, got {raw!r}")
    events = tuple(sorted((_parse_event(e, f"{where}.events[{i}]") for i, e in enumerate(raw)),
                          key=lambda e: e.time))
    process = None
    given = [k for k in ("mtbf", "mttr", "kinds", "pools", "slow_factor", "start") if k in value]
    if given:
        if "mtbf" not in value or "mttr" not in value:
            raise ConfigError(f"{where}: the fault process needs both mtbf and mttr (mean "
                              f"seconds up and down per instance); got only {', '.join(given)}")
        process = FaultProcess(
            _number(value["mtbf"], f"{where}.mtbf", positive=True),
            _number(value["mttr"], f"{where}.mttr", positive=True),
            _names(value.get("kinds", ["fail"]), FAULT_KINDS, f"{where}.kinds"),
            _names(value.get("pools", list(POOLS)), POOLS, f"{where}.pools"),
            _number(value.get("slow_factor", 0.5), f"{where}.slow_factor", positive=True,
                    upper=1.0),
            _number(value.get("start", 0.0), f"{where}.start", positive=False))
    return FaultPlan(events, process) if events or process else None


def instance_rng(seed: int, pool: str, index: int) -> np.random.Generator:
    """The generator of one instance's fault process: a function of the episode seed, the pool
    and the index only (independent of every other draw of the episode)."""
    return np.random.default_rng([int(seed), FAULT_STREAM, POOLS.index(pool), int(index)])


def draw_fault(rng: np.random.Generator, process: FaultProcess) -> tuple[str, float, float]:
    """The next fault of an instance's process, in draw order: (kind, duration, then the up-time
    that follows its recovery)."""
    kind = process.kinds[int(rng.integers(len(process.kinds)))]
    return kind, float(rng.exponential(process.mttr)), float(rng.exponential(process.mtbf))
