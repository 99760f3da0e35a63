"""Markdown rendering: a table per metric (mean ± 95% CI per policy, best baseline, reduction),
the scheduler-overhead and by-size tables, the whole report of an evaluation, and the failure
report."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence

import numpy as np

from hexagent_gym.experiments.cell_log import FAILURES_FILE
from hexagent_gym.experiments.cells import CellFailure
from hexagent_gym.experiments.grid import Report
from hexagent_gym.experiments.result import Evaluation
from hexagent_gym.experiments.stats import Row, Stat, mean_reduction, size_split


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
                 f"without prefix reuse (hexagent_gym.sim.load), λ = arrival rate; prefill_load = "
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



def format_failures(failures: Sequence[CellFailure], total: int | None = None) -> str:
    """The failure report: a header line, then each failed cell's parameters and error."""
    of = f" of {total}" if total is not None else ""
    lines = [f"{len(failures)}{of} cells failed; the other cells' records are kept. Run again "
             f"with --resume (resume=True) to retry only these:"]
    lines += [f.format() for f in failures]
    return "\n".join(lines)
