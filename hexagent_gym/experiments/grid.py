"""The experiment model: a :class:`Grid` of axes that expands into cells, the :class:`Report`
settings of its tables, and the named :class:`Experiment` that holds both.

Reading one from YAML is :func:`hexagent_gym.experiments.experiment_yaml.load_experiment`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hexagent_gym.config import ConfigError, resolve_config, suggest
from hexagent_gym.episode import EpisodeConfig
from hexagent_gym.experiments.cells import Cell, freeze_kwargs
from hexagent_gym.policy import policy_names

DEFAULT_POLICIES = ("hexagent", "fcfs", "wf-fcfs", "llf", "atlas")
DEFAULT_BASELINES = ("wf-fcfs", "llf", "atlas")
METRICS = ("req95", "req99", "mean_ratio", "max_ratio", "prefix_hit_rate", "prefill_load",
           "faster_than_alone", "decode_kv_peak", "preemptions", "decode_wait_mean",
           "decode_kv_delayed", "decode_moves", "fault_events", "fault_reexecuted_calls",
           "fault_recomputed_tokens")
"""Per-cell metrics a report may tabulate (``report.metrics``): the SLO scales, the prefix-cache
hit rate, ρ with the cache (prefill load of the work actually computed), the share of
workflows that finished sooner than alone, and the decode regime counters (peak KV use ÷
capacity, preemptions, mean decode-queue wait in seconds, share of calls held back by KV), and
the fault counters (docs/faults.md)."""
SLO_METRICS = ("req95", "req99", "mean_ratio", "max_ratio")
"""Metrics where lower is better: tables give the reference's reduction against the best
baseline for these only (the others describe the regime)."""


@dataclass(frozen=True)
class PolicySpec:
    """One entry of a grid's policy axis that is more than a bare policy name.

    Attributes:
        name: registered policy name (``hexagent_gym.policy.policy_names``), lower case.
        label: the entry's name in tables, figures and ``report.reference``/``baselines``
            (lower case; "" means ``name``). Labels are unique within a grid, and a label that
            is a registered policy name must be the entry's own name.
        kwargs: constructor arguments, applied on top of ``Grid.policy_kwargs[name]``.
    """

    name: str
    label: str = ""
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # policy names are case-insensitive everywhere; labels follow so report.reference and
        # --policies match them the same way
        object.__setattr__(self, "name", self.name.lower())
        object.__setattr__(self, "label", self.label.lower())

    @property
    def shown_as(self) -> str:
        """The label, or the policy name when there is none."""
        return self.label or self.name


def check_clusters(names: Sequence[str], where: str) -> None:
    """Raise a ConfigError naming ``where`` for a cluster that is neither shipped nor a YAML path
    (before any cell runs: an unknown name must not cost a grid's worth of work)."""
    for c in names:
        try:
            resolve_config("clusters", c)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None


def check_traces(names: Sequence[str], where: str) -> None:
    """Raise a ConfigError naming ``where`` for a trace that does not load (the loader caches
    it, so the cells load it again for free)."""
    from hexagent_gym.workload.workload import TraceError, load_trace

    for t in names:
        try:
            load_trace(t)
        except TraceError as exc:
            raise ConfigError(f"{where}: {exc}") from None


def _spec(entry: str | PolicySpec) -> PolicySpec:
    return entry if isinstance(entry, PolicySpec) else PolicySpec(entry.lower())


@dataclass(frozen=True)
class Grid:
    """The axes of an experiment. Cells are the product of every axis.

    Precedence of episode settings (later wins): the experiment's top-level episode keys
    (``base``), then ``per_trace[trace]``, then the swept axes (``loads``,
    ``estimation_errors``), then the variant's settings.

    Attributes:
        base: episode settings shared by every cell (the YAML's top-level episode keys).
        policies: policy names, or :class:`PolicySpec` entries for a policy with its own
            arguments and label (e.g. several ATLAS settings side by side).
        clusters: cluster names or YAML paths (None: ``base.cluster``).
        traces: trace names or JSONL paths (None: ``base.trace``).
        seeds: episode seeds (None: ``base.seed``).
        loads: prefill utilisations ρ to sweep (None: the base / per-trace load).
        estimation_errors: estimation-error levels to sweep (None: the base level).
        per_trace: episode settings per trace name, e.g. ``{"lats": {"num_workflows": 100}}``.
        variants: named episode-setting overrides swept as one more axis, e.g.
            ``(("k32", {"max_calls_per_decision": 32}),)``.
        policy_kwargs: constructor arguments per policy name (every entry of that policy).

    Raises:
        ConfigError: no policies, an unknown policy, a duplicated or misleading label, or an
            empty axis.
    """

    base: EpisodeConfig = field(default_factory=EpisodeConfig)
    policies: tuple[str | PolicySpec, ...] = DEFAULT_POLICIES
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
            name = p.name if isinstance(p, PolicySpec) else p.lower()
            if name not in known:
                raise ConfigError(f"grid.policies: unknown policy '{name}'; known policies: "
                                  f"{', '.join(known)}.{suggest(name, known)}")
        labels = [s.shown_as for s in self.policy_specs()]
        for s in self.policy_specs():
            if s.label and s.label != s.name and s.label in known:
                raise ConfigError(f"grid.policies: the {s.name} entry is labelled '{s.label}', "
                                  f"which is another registered policy; pick a label that is "
                                  f"not a policy name")
        for label in labels:
            if labels.count(label) > 1:
                raise ConfigError(f"grid.policies: {labels.count(label)} entries go by "
                                  f"'{label}'; give each entry its own label")
        for name in ("clusters", "traces", "seeds", "loads", "estimation_errors"):
            v = getattr(self, name)
            if v is not None and len(v) == 0:
                raise ConfigError(f"grid.{name} must not be empty (leave it out to use the "
                                  f"top-level value)")

    def policy_specs(self) -> tuple[PolicySpec, ...]:
        """The policy axis with bare names as :class:`PolicySpec` entries."""
        return tuple(_spec(p) for p in self.policies)

    @property
    def labels(self) -> tuple[str, ...]:
        """The policy axis as tables show it: each entry's label, else its policy name."""
        return tuple(s.shown_as for s in self.policy_specs())

    def cells(self) -> list[Cell]:
        """Every cell, ordered so cells sharing a factory are adjacent (seeds, then policies)."""
        base = self.base
        specs = self.policy_specs()
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
                                for s in specs:
                                    kwargs = {**self.policy_kwargs.get(s.name, {}), **s.kwargs}
                                    label = s.label if s.label != s.name else ""
                                    out.append(Cell(s.name, episode.replace(seed=seed),
                                                    freeze_kwargs(kwargs), variant, label))
        return out


@dataclass(frozen=True)
class Report:
    """What the tables show.

    Attributes:
        metrics: per-cell metrics tabulated (columns), from :data:`METRICS`.
        reference: the policy (or policy label) whose reduction against the baselines is
            reported.
        baselines: the policies (or labels) whose best (lowest seed-mean) sets the reduction.
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
                       quick: bool = False, quick_workflows: int = 50,
                       replay: bool = False) -> Experiment:
        """A copy with command-line style overrides applied (None leaves an axis as it is).

        ``policies`` names policies or the labels of the grid's :class:`PolicySpec` entries (a
        label keeps its entry, arguments included). ``num_workflows`` replaces the count
        everywhere (top level, per trace and variants). ``quick`` keeps the first seed only and
        caps every workflow count at ``quick_workflows``. ``replay`` replays each trace's own
        arrival times (every row in ``arrival_s`` order; with ``num_workflows`` or ``quick`` the
        first rows): it clears every ``load`` and ``arrival_rate`` (top level, per trace,
        variants, the loads axis) and every workflow count.

        Raises:
            ConfigError: an unknown policy, cluster or trace; ``replay`` with ``loads``; a trace
                to replay that has no arrival times.
        """
        if replay and loads is not None:
            raise ConfigError("--replay replays the traces' own arrival times: drop --load")
        g = self.grid
        changes: dict[str, Any] = {}
        for name, value in (("policies", policies), ("clusters", clusters), ("traces", traces),
                            ("seeds", seeds), ("loads", loads),
                            ("estimation_errors", estimation_errors)):
            if value is not None:
                changes[name] = tuple(value)
        if policies is not None:
            entries = {p.shown_as: p for p in g.policies if isinstance(p, PolicySpec)}
            changes["policies"] = tuple(entries.get(p.lower(), p.lower()) for p in policies)
        g = dataclasses.replace(g, **changes)  # Grid.__post_init__ checks the policy names
        if clusters is not None:
            check_clusters(clusters, "--clusters")
        if traces is not None:
            check_traces(traces, "--traces")

        def counts(fn: Callable[[int | None], int | None]) -> Grid:
            per = {t: {**s, "num_workflows": fn(s["num_workflows"])} if "num_workflows" in s
                   else dict(s) for t, s in g.per_trace.items()}
            variants = tuple((n, {**s, "num_workflows": fn(s["num_workflows"])}
                              if "num_workflows" in s else dict(s)) for n, s in g.variants)
            return dataclasses.replace(g, base=g.base.replace(
                num_workflows=fn(g.base.num_workflows)), per_trace=per, variants=variants)

        if replay:
            g = _replay_grid(g)
        if num_workflows is not None:
            g = counts(lambda _n: num_workflows)
        if quick:
            g = counts(lambda n: quick_workflows if n is None else min(n, quick_workflows))
            g = dataclasses.replace(g, seeds=(g.seeds or (g.base.seed,))[:1])
        # Validate every cell's episode settings now, not halfway through a run.
        g.cells()
        if replay:
            check_replayable(g.traces or (g.base.trace,), "--replay")
        return dataclasses.replace(self, grid=g)


_ARRIVAL_KEYS = ("load", "arrival_rate", "num_workflows")


def _replay_grid(g: Grid) -> Grid:
    """``g`` with every arrival-process and workflow-count setting cleared (replay mode)."""

    def keep(settings: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in settings.items() if k not in _ARRIVAL_KEYS}

    return dataclasses.replace(
        g, base=g.base.replace(load=None, arrival_rate=None, num_workflows=None), loads=None,
        per_trace={t: keep(s) for t, s in g.per_trace.items()},
        variants=tuple((n, keep(s)) for n, s in g.variants))


def check_replayable(names: Sequence[str], where: str) -> None:
    """Raise a ConfigError naming ``where`` for a trace with a workflow that has no
    ``arrival_s`` (replay needs every row's own arrival time)."""
    from hexagent_gym.workload.workload import load_trace

    for t in names:
        trace = load_trace(t)
        missing = next((w for w in trace.workflows if w.arrival_s is None), None)
        if missing is not None:
            raise ConfigError(f"{where}: trace '{trace.name}' ({trace.source}) has no arrival "
                              f"times (workflow '{missing.workflow_id}' on line {missing.line} "
                              f"has arrival_s = null): only traces with timestamps (e.g. "
                              f"Mooncake, Qwen-Bailian files, or JSONL with arrival_s) replay; "
                              f"drop --replay to draw Poisson arrivals")
