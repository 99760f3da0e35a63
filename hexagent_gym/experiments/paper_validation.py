"""Our paper-testbed results against the HexAgent paper's (arXiv 2605.16637) table numbers.

The paper's numbers live in ``configs/paper/tables.yaml`` (``paper_tables.load_paper_tables``),
each a *claim*: one cell (``cell``), a mean reduction over rows (``mean_reduction``), a direction
without a number (``order``) or a measured span (``range``). :func:`evaluate_claims` puts our
cell records (``results.json["cells"]`` of the ``paper_table*`` experiments) next to them;
``paper_report.format_report`` prints every claim side by side with ours, the counts within
range per table and the per-cluster reduction patterns. ``scripts/validate_paper.py`` is the
command line.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hexagent_gym.experiments.cells import policy_label
from hexagent_gym.experiments.paper_tables import PaperClaim, PaperTables
from hexagent_gym.experiments.stats import Stat

WITHIN = (0.8, 1.25)
"""ours / paper within this closed interval counts as agreeing (the project's 0.8–1.25× band)."""
SHIPPED_BASELINES = ("fcfs", "wf-fcfs", "llf", "atlas", "sglang-router", "random")
"""Every shipped baseline policy: the paper's (per-call FCFS, workflow FCFS, LLF, ATLAS) and
ours (an SGLang-router-style balancer, random). HexAgent's variants and ablations (``fallback``,
``hexagent-lb``, ...) mix in HexAgent's own parts and are not baselines."""
AGREES, DIRECTION, PART, DISAGREES, NOT_RUN = ("agrees", "agrees in direction", "agrees in part",
                                               "does not agree", "not run")
TIMING_METRICS = {"scheduler_ms_per_invocation": "scheduler_ms_per_invocation"}
"""Metrics read from a record's ``timing`` block (wall clock) instead of ``metrics``."""

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
