"""The paper-validation report: every claim side by side with ours, the counts within range per
table and the per-cluster reduction patterns, as markdown (``scripts/validate_paper.py``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hexagent_gym.experiments.paper_tables import PaperClaim, PaperTables
from hexagent_gym.experiments.paper_validation import (
    AGREES,
    DIRECTION,
    DISAGREES,
    NOT_RUN,
    PART,
    SHIPPED_BASELINES,
    Outcome,
    PatternRow,
    cluster_patterns,
    evaluate_claims,
    table_counts,
    total_within,
)

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
