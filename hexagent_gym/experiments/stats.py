"""Statistics over seeds: the mean and Student-t 95% interval of a metric, table rows, the
reference policy's reduction against the best baseline, and the small/large workflow split.

Records group into rows by episode settings without the seed (plus variant), and within a row
by policy label (:func:`~hexagent_gym.experiments.cells.policy_label`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hexagent_gym.experiments.cells import policy_label
from hexagent_gym.experiments.grid import METRICS, SLO_METRICS, Report
from hexagent_gym.sim.metrics import req

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
        stats: metric statistics per policy label: ``stats[policy][metric]``.
        records: the row's cell records per policy label, in seed order.
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

    Within a row, records group by policy label (the policy name unless the grid entry has a
    label). Each metric of each policy is averaged over the row's seeds (:class:`Stat`). The best
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
        row.records.setdefault(policy_label(rec["cell"]), []).append(rec)
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

