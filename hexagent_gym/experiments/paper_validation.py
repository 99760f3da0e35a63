"""Our paper-testbed results against the HexAgent paper's (arXiv 2605.16637) table numbers.

The paper's numbers live in ``configs/paper/tables.yaml`` (:func:`load_paper_tables`), each a
*claim*: one cell (``cell``), a mean reduction over rows (``mean_reduction``), a direction
without a number (``order``) or a measured span (``range``). :func:`evaluate_claims` puts our
cell records (``results.json["cells"]`` of the ``paper_table*`` experiments) next to them;
:func:`format_report` prints every claim side by side with ours, the counts within range per
table and the per-cluster reduction patterns. ``scripts/validate_paper.py`` is the command line.

Verdict rules (fixed before any paper-testbed run; the tests hold them):

* **Within range**: the ratio ours / paper lies in [0.8, 1.25] (:data:`WITHIN`). For a
  ``range`` claim (low..high) the ratio is to the nearer end, and 1 inside the span.
* **Ours.** m(policy) is the policy's mean over seeds in the row (cluster, trace) of the
  experiment. ``cell``: m of the claim's policy and metric. ``mean_reduction``: the mean over
  the claim's rows that ran of 1 − m(reference) / m(best), where best is the **best baseline**:
  the shipped baseline (:data:`SHIPPED_BASELINES`) with the lowest m among every one the
  experiment ran in that row (not only the paper's set, so no baseline we run is left out; the
  report names it per row and also shows the reduction against the paper's set). ``range``:
  the policy's mean milliseconds per scheduler invocation over the claim's cells. ``order``:
  whether m(above) > m(below), row by row.
* **Verdicts.** ``cell``, ``mean_reduction``: *agrees* when within range; else *agrees in
  direction* when ours has the paper's strict sign (a reduction: its sign; a cell: the sign of
  m(policy) − m(reference) in its row, for the reference cell itself against the row's best
  baseline, the paper's side computed from the paper's cells of that row); else *does not
  agree* (also when the paper gives nothing to take a sign from). ``range``: *agrees* when
  within range, else *does not agree* (an absolute cost has no direction). ``order``:
  *agrees* when it holds in every row that ran, *agrees in part* in some, *does not agree* in
  none (equal means do not hold). *not run*: none of the claim's rows is in the results.
* **Counts** per table: the paper numbers (``cell``, ``mean_reduction``, ``range``) that ran
  and how many of them are within range. ``order`` claims carry no number and are not counted.

This module reads YAML through :mod:`hexagent_gym.config` and imports no RL library.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hexagent_gym.config import ConfigError, configs_dir, load_named, load_yaml, suggest
from hexagent_gym.experiments.cells import policy_label
from hexagent_gym.experiments.stats import Stat

WITHIN = (0.8, 1.25)
"""ours / paper within this closed interval counts as agreeing (the project's 0.8–1.25× band)."""
SHIPPED_BASELINES = ("fcfs", "wf-fcfs", "llf", "atlas", "sglang-router", "random")
"""Every shipped baseline policy: the paper's (per-call FCFS, workflow FCFS, LLF, ATLAS) and
ours (an SGLang-router-style balancer, random). HexAgent's variants and ablations (``fallback``,
``hexagent-lb``, ...) mix in HexAgent's own parts and are not baselines."""
KINDS = ("cell", "mean_reduction", "order", "range")
NUMERIC_KINDS = ("cell", "mean_reduction", "range")
"""Claim kinds that carry a paper number (counted within range or not)."""
AGREES, DIRECTION, PART, DISAGREES, NOT_RUN = ("agrees", "agrees in direction", "agrees in part",
                                               "does not agree", "not run")
TIMING_METRICS = {"scheduler_ms_per_invocation": "scheduler_ms_per_invocation"}
"""Metrics read from a record's ``timing`` block (wall clock) instead of ``metrics``."""

_COMMON = ("id", "kind", "metric", "source", "quoted_in")
_KEYS = {
    "cell": _COMMON + ("model", "cluster", "paper_cluster", "trace", "policy", "value"),
    "mean_reduction": _COMMON + ("models", "clusters", "traces", "reference", "baselines",
                                 "value"),
    "order": _COMMON + ("models", "clusters", "traces", "above", "below"),
    "range": _COMMON + ("models", "clusters", "traces", "policy", "low", "high"),
}
_OPTIONAL = {"paper_cluster", "quoted_in"}
_TABLE_KEYS = ("title", "experiment", "missing", "claims")


@dataclass(frozen=True)
class PaperClaim:
    """One paper number (or direction) and where it comes from.

    Attributes:
        id: unique name, e.g. ``table4-mean-reduction-req99``.
        table: the table group it belongs to (``table1``, ``table2_3``, ...).
        kind: ``cell``, ``mean_reduction``, ``order`` or ``range``.
        metric: ``req95``, ``req99``, ... or ``scheduler_ms_per_invocation``.
        source: where in the paper, e.g. ``arXiv 2605.16637, Table 4``.
        quoted_in: where this repository states it ("" when not given).
        models: model config names of the scope (one for a cell).
        clusters: our cluster configs of the scope (one for a cell).
        traces: trace names of the scope (one for a cell).
        policy: the cell's or the range's policy ("" otherwise).
        reference: the policy whose reduction a ``mean_reduction`` states.
        baselines: the paper's baseline set of a ``mean_reduction``.
        above: an ``order``'s policy with the higher Req.
        below: an ``order``'s policy with the lower Req.
        value: the paper's number (a reduction as a fraction); None for order and range.
        low: a range's lower end.
        high: a range's upper end.
        paper_cluster: the paper's name of the cell's cluster ("" when not given).
    """

    id: str
    table: str
    kind: str
    metric: str
    source: str
    quoted_in: str = ""
    models: tuple[str, ...] = ()
    clusters: tuple[str, ...] = ()
    traces: tuple[str, ...] = ()
    policy: str = ""
    reference: str = ""
    baselines: tuple[str, ...] = ()
    above: str = ""
    below: str = ""
    value: float | None = None
    low: float | None = None
    high: float | None = None
    paper_cluster: str = ""

    @property
    def numeric(self) -> bool:
        """True for a claim that carries a paper number (counted within range or not)."""
        return self.kind in NUMERIC_KINDS

    @property
    def rows(self) -> list[tuple[str, str]]:
        """The (cluster, trace) rows of the claim's scope, clusters first."""
        return [(c, t) for c in self.clusters for t in self.traces]

    def paper_text(self) -> str:
        """The paper's side as the report prints it."""
        if self.kind == "mean_reduction":
            return f"{100 * self.value:.1f}%"
        if self.kind == "order":
            return f"{self.above} > {self.below}"
        if self.kind == "range":
            return f"{self.low:g}–{self.high:g}"
        return f"{self.value:.2f}"


@dataclass(frozen=True)
class PaperTable:
    """One table group of the data file: its claims, the experiment that answers them (None:
    none does), and what the repository does not state (``missing``)."""

    name: str
    title: str
    experiment: str | None
    claims: tuple[PaperClaim, ...]
    missing: str = ""


@dataclass(frozen=True)
class PaperTables:
    """The whole data file: the paper it quotes and its tables in file order."""

    paper: str
    tables: tuple[PaperTable, ...]
    source: str = ""

    def claims(self) -> list[PaperClaim]:
        """Every claim of every table, in file order."""
        return [c for t in self.tables for c in t.claims]

    def select(self, names: Sequence[str] | None) -> PaperTables:
        """The tables named (None: all). Raises ConfigError for an unknown name."""
        if names is None:
            return self
        known = [t.name for t in self.tables]
        for n in names:
            if n not in known:
                raise ConfigError(f"unknown paper table '{n}'; known: {', '.join(known)}."
                                  f"{suggest(n, known)}")
        return PaperTables(self.paper, tuple(t for t in self.tables if t.name in names),
                           self.source)


def default_paper_file() -> Path:
    """``configs/paper/tables.yaml`` of this checkout."""
    return configs_dir() / "paper" / "tables.yaml"


def load_paper_tables(path: str | Path | None = None, *,
                      check_models: bool = True) -> PaperTables:
    """Read and validate the paper's numbers.

    Args:
        path: the YAML file (None: :func:`default_paper_file`).
        check_models: check that each cluster config's model is one of the claim's models and
            that every listed model has a cluster (reads the cluster configs).

    Raises:
        ConfigError: unreadable file, unknown or missing keys, ill-typed values, a duplicate id,
            a cluster whose model does not match; the message names the file and the entry.
    """
    path = Path(path) if path is not None else default_paper_file()
    if not path.is_file():
        raise ConfigError(f"paper numbers file '{path}' does not exist (the shipped one is "
                          f"configs/paper/tables.yaml of the repository)")
    data = load_yaml(path)
    src = str(path)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{src}: expected a mapping with 'paper' and 'tables'")
    _keys(data, ("paper", "tables"), src, required=("paper", "tables"))
    paper = data["paper"]
    if not isinstance(paper, str) or not paper:
        raise ConfigError(f"{src}: 'paper' must be a non-empty string, got {paper!r}")
    if not isinstance(data["tables"], Mapping) or not data["tables"]:
        raise ConfigError(f"{src}: 'tables' must be a non-empty mapping of table groups")
    tables, ids = [], set()
    for name, body in data["tables"].items():
        where = f"{src}: tables.{name}"
        if not isinstance(body, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {type(body).__name__}")
        _keys(body, _TABLE_KEYS, where, required=("title", "experiment", "claims"))
        experiment = body["experiment"]
        if experiment is not None and not isinstance(experiment, str):
            raise ConfigError(f"{where}.experiment: expected a name or null, got {experiment!r}")
        if not isinstance(body["claims"], list):
            raise ConfigError(f"{where}.claims: expected a list, got "
                              f"{type(body['claims']).__name__}")
        claims = []
        for i, entry in enumerate(body["claims"]):
            claim = _claim(entry, str(name), f"{where}.claims[{i}]")
            if claim.id in ids:
                raise ConfigError(f"{where}.claims[{i}]: duplicate id '{claim.id}'")
            ids.add(claim.id)
            if check_models:
                _check_models(claim, f"{where}.claims[{i}]")
            claims.append(claim)
        if claims and experiment is None:
            raise ConfigError(f"{where}: claims need an experiment that answers them")
        tables.append(PaperTable(str(name), _text(body["title"]), experiment, tuple(claims),
                                 _text(body.get("missing") or "")))
    return PaperTables(paper, tuple(tables), src)


def _text(v: Any) -> str:
    return " ".join(str(v).split())


def _keys(data: Mapping[str, Any], allowed: Sequence[str], where: str,
          required: Sequence[str] = ()) -> None:
    for k in data:
        if k not in allowed:
            raise ConfigError(f"{where}: unknown key '{k}'; known: {', '.join(allowed)}."
                              f"{suggest(str(k), list(allowed))}")
    for k in required:
        if k not in data:
            raise ConfigError(f"{where}: missing key '{k}'")


def _claim(entry: Any, table: str, where: str) -> PaperClaim:
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(entry).__name__}")
    kind = entry.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"{where}.kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    allowed = _KEYS[kind]
    _keys(entry, allowed, where, required=[k for k in allowed if k not in _OPTIONAL])

    def string(k: str) -> str:
        v = entry[k]
        if not isinstance(v, str) or not v.strip():
            raise ConfigError(f"{where}.{k}: expected a non-empty string, got {v!r}")
        return _text(v)

    def strings(k: str) -> tuple[str, ...]:
        v = entry[k]
        if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
            raise ConfigError(f"{where}.{k}: expected a non-empty list of names, got {v!r}")
        return tuple(v)

    def number(k: str) -> float:
        v = entry[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfigError(f"{where}.{k}: expected a finite number, got {v!r}")
        return float(v)

    kw: dict[str, Any] = {"id": string("id"), "table": table, "kind": kind,
                          "metric": string("metric"), "source": string("source")}
    if "quoted_in" in entry:
        kw["quoted_in"] = string("quoted_in")
    if not kw["source"].startswith("arXiv"):
        raise ConfigError(f"{where}.source: cite the paper ('arXiv 2605.16637, Table N'), got "
                          f"{kw['source']!r}")
    if kind == "cell":
        kw.update(models=(string("model"),), clusters=(string("cluster"),),
                  traces=(string("trace"),), policy=string("policy"), value=number("value"))
        if "paper_cluster" in entry:
            kw["paper_cluster"] = string("paper_cluster")
    else:
        kw.update(models=strings("models"), clusters=strings("clusters"),
                  traces=strings("traces"))
    if kind == "mean_reduction":
        kw.update(reference=string("reference"), baselines=strings("baselines"),
                  value=number("value"))
        if not -1.0 < kw["value"] < 1.0:
            raise ConfigError(f"{where}.value: a reduction is a fraction in (-1, 1) (0.13 = 13% "
                              f"lower), got {kw['value']!r}")
    elif kind == "order":
        kw.update(above=string("above"), below=string("below"))
    elif kind == "range":
        kw.update(policy=string("policy"), low=number("low"), high=number("high"))
        if not 0 < kw["low"] <= kw["high"]:
            raise ConfigError(f"{where}: expected 0 < low <= high, got {kw['low']!r}.."
                              f"{kw['high']!r}")
    elif kw["value"] <= 0:
        raise ConfigError(f"{where}.value: a cell value must be > 0, got {kw['value']!r}")
    return PaperClaim(**kw)


def _check_models(claim: PaperClaim, where: str) -> None:
    seen = set()
    for c in claim.clusters:
        try:
            data, _ = load_named("clusters", c)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        model = str(data.get("model", "")).lower()
        if model not in [m.lower() for m in claim.models]:
            raise ConfigError(f"{where}: cluster '{c}' runs model '{model}', not one of the "
                              f"claim's models {', '.join(claim.models)}")
        seen.add(model)
    extra = [m for m in claim.models if m.lower() not in seen]
    if extra:
        raise ConfigError(f"{where}: model(s) {', '.join(extra)} have no cluster in the claim")


# ---------------------------------------------------------------------------------------------
# Our side: records grouped into rows


def trace_name(trace: str) -> str:
    """A record's trace as the data file names it: a shipped name, or a path's stem."""
    return Path(trace).stem if trace.endswith((".jsonl", ".gz", ".json")) else trace


@dataclass
class OurRow:
    """Our cells of one (cluster, trace) row: records per policy label, the policy each label
    runs, and the seed-mean of a metric (:meth:`mean`)."""

    cluster: str
    trace: str
    records: dict[str, list[Mapping[str, Any]]] = field(default_factory=dict)
    policy_of: dict[str, str] = field(default_factory=dict)

    def mean(self, label: str, metric: str) -> float | None:
        """Mean over seeds of ``metric`` for ``label`` (None: not run, or no value)."""
        recs = self.records.get(label)
        if not recs:
            return None
        block = "timing" if metric in TIMING_METRICS else "metrics"
        vals = [r.get(block, {}).get(TIMING_METRICS.get(metric, metric)) for r in recs]
        vals = [float(v) for v in vals if v is not None]
        if not vals:
            return None
        m = Stat.of(vals).mean
        return None if math.isnan(m) else m

    def baselines(self, reference: str, among: Sequence[str] | None = None) -> list[str]:
        """Labels of the shipped baselines run in this row (``among``: only these names)."""
        if among is None:
            return [lab for lab, pol in self.policy_of.items()
                    if lab != reference and pol in SHIPPED_BASELINES]
        return [lab for lab in self.policy_of if lab != reference and lab in among]

    def best(self, metric: str, reference: str,
             among: Sequence[str] | None = None) -> tuple[str, float] | None:
        """The baseline with the lowest seed mean, with that mean. Equal means go to the one
        listed first in ``among`` (default :data:`SHIPPED_BASELINES`), so the name reported
        does not depend on the grid's policy order."""
        order = list(among if among is not None else SHIPPED_BASELINES)

        def rank(label: str) -> int:
            name = label if among is not None else self.policy_of[label]
            return order.index(name) if name in order else len(order)

        cands = [(lab, m) for lab in self.baselines(reference, among)
                 if (m := self.mean(lab, metric)) is not None]
        return min(cands, key=lambda x: (x[1], rank(x[0]))) if cands else None


def our_rows(records: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], OurRow]:
    """Group cell records by (cluster, trace).

    Raises:
        ValueError: two different episode settings (e.g. two loads) share a (cluster, trace):
            the data file's rows would be ambiguous.
    """
    rows: dict[tuple[str, str], OurRow] = {}
    settings: dict[tuple[str, str], str] = {}
    for rec in records:
        cell = rec["cell"]
        ep = cell["episode"]
        key = (str(ep["cluster"]), trace_name(str(ep["trace"])))
        ident = repr(sorted((k, repr(v)) for k, v in ep.items() if k != "seed")
                     + [("variant", cell.get("variant", ""))])
        if settings.setdefault(key, ident) != ident:
            raise ValueError(f"results hold two settings of row {key[0]}/{key[1]} (other than "
                             f"the seed); validate one setting per cluster and trace")
        row = rows.setdefault(key, OurRow(*key))
        label = policy_label(cell)
        row.records.setdefault(label, []).append(rec)
        row.policy_of[label] = cell["policy"]
    return rows


# ---------------------------------------------------------------------------------------------
# Claims against our rows


def ratio(ours: float | None, paper: float | None) -> float | None:
    """ours / paper; None when either is missing or the paper's value is 0."""
    if ours is None or paper is None or paper == 0 or math.isnan(ours):
        return None
    return ours / paper


def within(r: float | None, band: tuple[float, float] = WITHIN) -> bool:
    """True when the ratio lies in the closed band (0.8–1.25×)."""
    return r is not None and band[0] <= r <= band[1]


def range_ratio(ours: float | None, low: float, high: float) -> float | None:
    """ours / the nearer end of [low, high]; 1 inside (None when ours is missing)."""
    if ours is None:
        return None
    if ours < low:
        return ours / low
    if ours > high:
        return ours / high
    return 1.0


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


@dataclass
class Outcome:
    """One claim against our results.

    Attributes:
        claim: the paper's claim.
        ours: our number (None for order claims and claims not run).
        ratio: ours / paper (range: to the nearer end).
        verdict: one of ``agrees``, ``agrees in direction``, ``agrees in part``,
            ``does not agree``, ``not run``.
        rows_run: rows of the claim's scope present in the results.
        holds: order claims: rows where it holds.
        best: mean_reduction: the best baseline per row that ran, ``{(cluster, trace): label}``.
        paper_set: mean_reduction: our mean reduction against the paper's own baseline set.
        note: a short explanation for the report ("" when none).
    """

    claim: PaperClaim
    ours: float | None = None
    ratio: float | None = None
    verdict: str = NOT_RUN
    rows_run: int = 0
    holds: int = 0
    best: dict[tuple[str, str], str] = field(default_factory=dict)
    paper_set: float | None = None
    note: str = ""

    @property
    def within(self) -> bool:
        """True for a numeric claim whose ratio is within range."""
        return self.claim.numeric and within(self.ratio)

    @property
    def counted(self) -> bool:
        """True for a numeric claim that ran (part of the per-table counts)."""
        return self.claim.numeric and self.verdict != NOT_RUN


def reduction(row: OurRow, metric: str, reference: str,
              among: Sequence[str] | None = None) -> tuple[float, str] | None:
    """1 − m(reference) / m(best baseline) in one row, with the best baseline's label."""
    ref = row.mean(reference, metric)
    best = row.best(metric, reference, among)
    if ref is None or best is None or not best[1] > 0:
        return None
    return 1.0 - ref / best[1], best[0]


def evaluate_claim(claim: PaperClaim, rows: Mapping[tuple[str, str], OurRow],
                   peers: Sequence[PaperClaim] = ()) -> Outcome:
    """Our side of one claim, its ratio and verdict (module docstring: the rules).

    Args:
        claim: the paper's claim.
        rows: our rows (:func:`our_rows`) of the experiment that answers it.
        peers: the other claims of its table: a cell's direction needs the paper's cells of
            the same row (its reference's, or its baselines').
    """
    out = Outcome(claim)
    present = [rows[k] for k in claim.rows if k in rows]
    if claim.kind == "order":
        checked = [(r.mean(claim.above, claim.metric), r.mean(claim.below, claim.metric))
                   for r in present]
        checked = [(a, b) for a, b in checked if a is not None and b is not None]
        out.rows_run = len(checked)
        if not checked:
            return out
        out.holds = sum(a > b for a, b in checked)
        ties = sum(a == b for a, b in checked)
        out.verdict = (AGREES if out.holds == len(checked) else PART if out.holds
                       else DISAGREES)
        out.note = f"holds in {out.holds} of {len(checked)} rows" + (
            f" ({ties} equal)" if ties else "")
        return out
    if claim.kind == "mean_reduction":
        found = []
        paper_set = []
        for r in present:
            red = reduction(r, claim.metric, claim.reference)
            if red is None:
                continue
            found.append(red[0])
            out.best[(r.cluster, r.trace)] = red[1]
            ps = reduction(r, claim.metric, claim.reference, claim.baselines)
            if ps is not None:
                paper_set.append(ps[0])
        out.rows_run = len(found)
        if not found:
            return out
        out.ours = sum(found) / len(found)
        out.paper_set = sum(paper_set) / len(paper_set) if paper_set else None
        out.ratio = ratio(out.ours, claim.value)
        same_side = _sign(out.ours) != 0 and _sign(out.ours) == _sign(claim.value)
        out.verdict = AGREES if within(out.ratio) else DIRECTION if same_side else DISAGREES
        return out
    if claim.kind == "range":
        vals = [m for r in present if (m := r.mean(claim.policy, claim.metric)) is not None]
        out.rows_run = len(vals)
        if not vals:
            return out
        out.ours = sum(vals) / len(vals)
        out.ratio = range_ratio(out.ours, claim.low, claim.high)
        out.verdict = AGREES if within(out.ratio) else DISAGREES
        return out
    # a single cell
    row = present[0] if present else None
    mine = None if row is None else row.mean(claim.policy, claim.metric)
    if mine is None:
        return out
    out.rows_run = 1
    out.ours = mine
    out.ratio = ratio(mine, claim.value)
    if within(out.ratio):
        out.verdict = AGREES
        return out
    out.verdict = DISAGREES
    side = _cell_sides(claim, row, peers)
    if side is None:
        out.note = "no paper cell of this row to take a direction from"
    elif side[0] != 0 and side[0] == side[1]:
        out.verdict = DIRECTION
    return out


def _cell_sides(claim: PaperClaim, row: OurRow,
                peers: Sequence[PaperClaim]) -> tuple[int, int] | None:
    """(paper sign, our sign) of a cell against its row's reference (HexAgent), or, for the
    reference's own cell, against the row's best baseline; None without the paper's side."""
    same = [p for p in peers if p.kind == "cell" and p.id != claim.id
            and p.clusters == claim.clusters and p.traces == claim.traces
            and p.metric == claim.metric]
    reference = "hexagent"
    if claim.policy != reference:
        paper_ref = next((p.value for p in same if p.policy == reference), None)
        ours_ref = row.mean(reference, claim.metric)
        if paper_ref is None or ours_ref is None:
            return None
        return _sign(claim.value - paper_ref), _sign(row.mean(claim.policy, claim.metric)
                                                     - ours_ref)
    paper_base = [p.value for p in same if p.policy in SHIPPED_BASELINES]
    ours_best = row.best(claim.metric, reference)
    if not paper_base or ours_best is None:
        return None
    return _sign(claim.value - min(paper_base)), _sign(row.mean(reference, claim.metric)
                                                       - ours_best[1])


def evaluate_claims(tables: PaperTables,
                    records_by_experiment: Mapping[str, Sequence[Mapping[str, Any]]]
                    ) -> list[Outcome]:
    """Every claim of ``tables`` against the records of the experiment that answers it (an
    experiment without records leaves its claims *not run*)."""
    outcomes = []
    for table in tables.tables:
        records = records_by_experiment.get(table.experiment or "", [])
        rows = our_rows(records)
        for claim in table.claims:
            outcomes.append(evaluate_claim(claim, rows, table.claims))
    return outcomes


@dataclass(frozen=True)
class TableCount:
    """Per table: paper numbers in the data file, those that ran, those within range."""

    table: str
    numbers: int
    run: int
    within: int


def table_counts(tables: PaperTables, outcomes: Sequence[Outcome]) -> list[TableCount]:
    """The count within 0.8–1.25× per table (numeric claims only), in file order."""
    out = []
    for t in tables.tables:
        mine = [o for o in outcomes if o.claim.table == t.name and o.claim.numeric]
        out.append(TableCount(t.name, len(mine), sum(o.counted for o in mine),
                              sum(o.within for o in mine)))
    return out


def total_within(outcomes: Sequence[Outcome]) -> int:
    """Paper numbers within 0.8–1.25× over every table."""
    return sum(o.within for o in outcomes)


# ---------------------------------------------------------------------------------------------
# Per-cluster reduction patterns


@dataclass(frozen=True)
class PatternRow:
    """HexAgent against the best shipped baseline in one (cluster, trace) row, per metric:
    ``(reference mean, best label, best mean, reduction)``."""

    cluster: str
    trace: str
    by_metric: Mapping[str, tuple[float, str, float, float] | None]


def cluster_patterns(records: Sequence[Mapping[str, Any]], reference: str = "hexagent",
                     metrics: Sequence[str] = ("req95", "req99")) -> list[PatternRow]:
    """One row per (cluster, trace) of the records, in first-appearance order."""
    out = []
    for row in our_rows(records).values():
        by: dict[str, tuple[float, str, float, float] | None] = {}
        for m in metrics:
            ref = row.mean(reference, m)
            best = row.best(m, reference)
            by[m] = (None if ref is None or best is None or not best[1] > 0
                     else (ref, best[0], best[1], 1.0 - ref / best[1]))
        out.append(PatternRow(row.cluster, row.trace, by))
    return out


# ---------------------------------------------------------------------------------------------
# The report


def _shown_path(source: str) -> str:
    """The data file's path relative to the working directory where it lies below it (so a
    report pasted into the docs names a repository path, not this machine's)."""
    if not source:
        return "configs/paper/tables.yaml"
    try:
        return Path(source).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return source


def _md(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def _scope(claim: PaperClaim, rows_run: int) -> str:
    if claim.kind == "cell":
        return f"{claim.clusters[0]} / {claim.traces[0]} / {claim.policy}"
    who = f"{claim.policy}: " if claim.kind == "range" else ""
    return (f"{who}{', '.join(claim.clusters)} × {len(claim.traces)} traces "
            f"({rows_run}/{len(claim.rows)} rows)")


def _ours_text(o: Outcome) -> str:
    c = o.claim
    if o.verdict == NOT_RUN:
        return "–"
    if c.kind == "order":
        return o.note
    if c.kind == "mean_reduction":
        return _pct(o.ours)
    if c.kind == "range":
        return f"{o.ours:.3f}"
    return f"{o.ours:.2f}"


def _best_text(o: Outcome) -> str:
    if not o.best:
        return "–"
    counts = Counter(o.best.values()).most_common()
    text = ", ".join(f"{name} {n}" for name, n in counts)
    if o.paper_set is not None:
        text += f" (vs the paper's {'/'.join(o.claim.baselines)}: {_pct(o.paper_set)})"
    return text


def format_claims(outcomes: Sequence[Outcome]) -> str:
    """The side-by-side table: every paper number (or direction) with ours and the verdict."""
    body = []
    for o in outcomes:
        c = o.claim
        r = "–" if o.ratio is None else f"{o.ratio:.2f}"
        inside = ("yes" if o.within else "no") if o.counted else "–"
        body.append([c.source.replace("arXiv 2605.16637, ", ""), c.id, _scope(c, o.rows_run),
                     c.metric, c.paper_text(), _ours_text(o), r, inside, o.verdict,
                     _best_text(o)])
    return _md(["table", "claim", "scope (ours)", "metric", "paper", "ours", "ours/paper",
                "within 0.8–1.25×", "verdict", "best baseline (rows)"], body)


def format_counts(tables: PaperTables, outcomes: Sequence[Outcome]) -> str:
    """Per table: paper numbers, how many ran, how many are within range, what is missing."""
    body = []
    for t, n in zip(tables.tables, table_counts(tables, outcomes), strict=True):
        body.append([t.name, str(n.numbers), str(n.run), str(n.within), t.missing or "–"])
    return _md(["table", "paper numbers here", "run", "within 0.8–1.25×",
                "not in the repository (missing)"], body)


def format_patterns(patterns: Sequence[PatternRow], reference: str = "hexagent") -> str:
    """Per (cluster, trace): HexAgent, the best shipped baseline and the reduction, per metric,
    then each cluster's mean reduction over its traces."""
    metrics = list(patterns[0].by_metric) if patterns else []
    body = []
    by_cluster: dict[str, list[PatternRow]] = {}
    for p in patterns:
        by_cluster.setdefault(p.cluster, []).append(p)
    for cluster, rows in by_cluster.items():
        for p in rows:
            line = [cluster, p.trace]
            for m in metrics:
                v = p.by_metric[m]
                line += (["–", "–", "–"] if v is None
                         else [f"{v[0]:.2f}", f"{v[2]:.2f} ({v[1]})", _pct(v[3])])
            body.append(line)
        line = [cluster, "**mean**"]
        for m in metrics:
            reds = [p.by_metric[m][3] for p in rows if p.by_metric[m] is not None]
            line += ["", "", "**" + _pct(sum(reds) / len(reds) if reds else None) + "**"]
        body.append(line)
    header = ["cluster", "trace"]
    for m in metrics:
        header += [f"{reference} {m}", f"best baseline {m}", f"reduction {m}"]
    return _md(header, body)


def describe_runs(records_by_experiment: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """One line per experiment: cells, seeds, workflows per episode and the preset's keys."""
    lines = []
    for name, records in records_by_experiment.items():
        if not records:
            continue
        eps = [r["cell"]["episode"] for r in records]
        seeds = sorted({e["seed"] for e in eps})
        sizes = sorted({e["num_workflows"] for e in eps}, key=lambda n: (n is None, n or 0))
        preset = ", ".join(f"{k} {sorted({str(e.get(k)).lower() for e in eps})}"
                           for k in ("prefix_cache", "parallel_sampling"))
        lines.append(f"- {name}: {len(records)} cells, seeds {seeds}, workflows per episode "
                     f"{sizes}, {preset}")
    return lines


def format_report(tables: PaperTables,
                  records_by_experiment: Mapping[str, Sequence[Mapping[str, Any]]],
                  outcomes: Sequence[Outcome] | None = None) -> str:
    """The whole validation report (markdown): claims side by side, counts, patterns."""
    if outcomes is None:
        outcomes = evaluate_claims(tables, records_by_experiment)
    numbers = sum(o.claim.numeric for o in outcomes)
    parts = [
        f"Paper numbers: {_shown_path(tables.source)} ({tables.paper}). "
        f"Rules: hexagent_gym/experiments/paper_validation.py. Best baseline = the lowest "
        f"seed-mean of every shipped baseline the experiment ran (of "
        f"{', '.join(SHIPPED_BASELINES)}).",
        "",
        *describe_runs(records_by_experiment),
        "",
        "### Every paper number, side by side",
        "",
        format_claims(outcomes),
        "",
        "### Within 0.8–1.25× per table",
        "",
        format_counts(tables, outcomes),
        "",
        f"Within 0.8–1.25×: {total_within(outcomes)} of "
        f"{sum(o.counted for o in outcomes)} paper numbers run ({numbers} in the data file).",
    ]
    verdicts = Counter(o.verdict for o in outcomes)
    parts += ["Verdicts: " + ", ".join(f"{v} {verdicts[v]}" for v in
                                       (AGREES, DIRECTION, PART, DISAGREES, NOT_RUN)
                                       if verdicts[v]) + "."]
    seen: set[str] = set()
    for t in tables.tables:
        if not t.experiment or t.experiment in seen:
            continue
        seen.add(t.experiment)
        records = records_by_experiment.get(t.experiment) or []
        if not records:
            continue
        parts += ["", f"### Per-cluster reduction patterns: {t.experiment}", "",
                  format_patterns(cluster_patterns(records))]
    return "\n".join(parts) + "\n"
