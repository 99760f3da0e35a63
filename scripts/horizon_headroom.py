"""HexAgent with a forecast horizon against HexAgent, cell by cell (docs/horizons.md).

For each cell (cluster, trace, size and rate) and each horizon predictor (oracle — a bound —,
app-mean, learned), ``hexagent`` and ``hexagent-horizon`` run the same episodes (the eval half of
the trace, paired seeds); the predictors that learn are warm-started on episodes of the train
half. Prints each cell's Req95/Req99/mean-ratio tables (the runner's paired per-seed reduction
with its 95% t interval) and a summary: Req99 reduction per cell and predictor, and the learned
predictor's share of the oracle's gain.

Usage:
    python scripts/horizon_headroom.py                       # every cell, 20 seeds, 2 workers
    python scripts/horizon_headroom.py --cells asym-bfcl --seeds 5
    python scripts/horizon_headroom.py --no-prefix-cache     # the paper-testbed serving regime
    python scripts/horizon_headroom.py --offline             # forecast error per trace only
    python scripts/horizon_headroom.py --baselines           # and the shipped baselines

Results go to --out (default results/horizon_headroom/<cell>/), resumable with --resume.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hexagent_gym.config import ConfigError
from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.experiments import evaluate, load_experiment, report_text
from hexagent_gym.experiments.stats import summarize
from hexagent_gym.futures.horizon_predictors import offline_error

CELLS: dict[str, dict[str, Any]] = {
    # the loaded cells where HexAgent's running horizon costs the most
    "hetero1-bfcl": dict(cluster="hetero-1", trace="bfcl_v3", num_workflows=400,
                         arrival_rate=40.0),
    "asym-bfcl": dict(cluster="asym-2p8d", trace="bfcl_v3", num_workflows=50, arrival_rate=40.0),
    "homo-bfcl": dict(cluster="homo-h200-4p4d", trace="bfcl_v3", num_workflows=50,
                      arrival_rate=40.0),
    # the paper's other workloads at its rates: a forecast must not hurt where queues are short
    "hetero1-lats": dict(cluster="hetero-1", trace="lats", num_workflows=100, arrival_rate=40.0),
    "hetero1-sharegpt": dict(cluster="hetero-1", trace="sharegpt", num_workflows=100,
                             arrival_rate=10.0),
    "hetero2-mixed": dict(cluster="hetero-2", trace="mixed", num_workflows=100,
                          arrival_rate=10.0),
}
PREDICTORS: dict[str, dict[str, Any]] = {
    "oracle": {"horizon_predictor": "oracle"},
    "app-mean": {"horizon_predictor": "app-mean", "horizon_warm_start": 2},
    # the quantile and gate are the defaults, named so that a run made with others is not
    # resumed
    "learned": {"horizon_predictor": "learned", "horizon_warm_start": 2,
                "horizon_predictor_params": {"quantile": 0.1, "gate": 0.7}},
}


def experiment_of(cell: str, seeds: list[int], prefix_cache: bool) -> dict[str, Any]:
    """The experiment mapping of one cell: predictors as variants, hexagent as the baseline."""
    return {"name": f"horizon_{cell}", **CELLS[cell], "load": None, "workflow_split": "eval",
            "prefix_cache": prefix_cache,
            "grid": {"policies": ["hexagent", "hexagent-horizon"], "seeds": seeds,
                     "variants": PREDICTORS},
            "report": {"metrics": ["req95", "req99", "mean_ratio"],
                       "reference": "hexagent-horizon", "baselines": ["hexagent"]}}


BASELINES = ("fcfs", "wf-fcfs", "llf", "atlas", "sglang-router")
"""The shipped baselines (the paper's per-call FCFS, workflow FCFS, LLF and ATLAS, and an
SGLang-router-style balancer), run by ``--baselines`` on the same episodes."""


def baselines_experiment(cell: str, seeds: list[int], prefix_cache: bool) -> dict[str, Any]:
    """The experiment mapping of one cell's baselines (no forecast: none of them reads one)."""
    return {"name": f"horizon_{cell}_baselines", **CELLS[cell], "load": None,
            "workflow_split": "eval", "prefix_cache": prefix_cache,
            "grid": {"policies": list(BASELINES), "seeds": seeds},
            "report": {"metrics": ["req99"]}}


def baselines_summary(records_by_cell: dict[str, list], rows_by_cell: dict[str, list]) -> str:
    """Per cell: each baseline's mean Req99, the best of them, and hexagent's and the learned
    forecast's Req99 on the same seeds (means over the seeds each ran)."""
    lines = ["| cell | " + " | ".join(BASELINES) + " | best baseline | hexagent | "
             "hexagent-horizon (learned) |", "|---" * (len(BASELINES) + 4) + "|"]
    for cell, records in records_by_cell.items():
        req: dict[str, list[float]] = {}
        for rec in records:
            req.setdefault(rec["cell"]["policy"], []).append(rec["metrics"]["req99"])
        means = {p: sum(v) / len(v) for p, v in req.items() if v}
        best = min(means, key=lambda p: (means[p], p)) if means else None
        ours = ["–", "–"]
        learned = next((r for r in rows_by_cell.get(cell, []) if r.variant == "learned"), None)
        if learned is not None:
            ours = [f"{learned.stats['hexagent']['req99'].mean:.2f}",
                    f"{learned.stats['hexagent-horizon']['req99'].mean:.2f}"]
        lines.append(f"| {cell} | " + " | ".join(
            f"{means[p]:.2f}" if p in means else "–" for p in BASELINES)
            + f" | {best or '–'} | " + " | ".join(ours) + " |")
    return "\n".join(lines)


def summary(rows_by_cell: dict[str, list]) -> str:
    """Req99: hexagent's mean, each predictor's paired reduction (mean ± 95% CI, positive =
    lower Req99), and learned's share of the oracle's gain."""
    lines = ["| cell | seeds | hexagent Req99 | " + " | ".join(PREDICTORS)
             + " | learned / oracle |", "|---" * (4 + len(PREDICTORS)) + "|"]
    for cell, rows in rows_by_cell.items():
        by = {r.variant: r for r in rows}
        first = next(iter(by.values()))
        base = first.stats["hexagent"]["req99"]
        cols, gains = [], {}
        for name in PREDICTORS:
            st = by[name].paired.get("req99") if name in by else None
            gains[name] = None if st is None else st.mean
            cols.append("–" if st is None else f"{100 * st.mean:+.1f} % ± {100 * st.ci:.1f}")
        share = ("–" if not (gains.get("oracle") or 0.0) > 0.0 or gains.get("learned") is None
                 else f"{gains['learned'] / gains['oracle']:.0%}")
        lines.append(f"| {cell} | {base.n} | {base.mean:.2f} | " + " | ".join(cols)
                     + f" | {share} |")
    return "\n".join(lines)


def learned_summary(rows_by_cell: dict[str, list]) -> str:
    """The learned forecast's paired reduction of each metric (mean ± 95% CI, positive =
    lower), next to hexagent's own level."""
    metrics = (("req95", "Req95"), ("req99", "Req99"), ("mean_ratio", "mean ratio"))
    lines = ["| cell | " + " | ".join(f"hexagent {label} | learned {label}"
                                       for _, label in metrics) + " |",
             "|---" * (1 + 2 * len(metrics)) + "|"]
    for cell, rows in rows_by_cell.items():
        row = next((r for r in rows if r.variant == "learned"), None)
        if row is None:
            continue
        cols = []
        for key, _ in metrics:
            st = row.paired.get(key)
            cols.append(f"{row.stats['hexagent'][key].mean:.2f}")
            cols.append("–" if st is None else f"{100 * st.mean:+.1f} % ± {100 * st.ci:.1f}")
        lines.append(f"| {cell} | " + " | ".join(cols) + " |")
    return "\n".join(lines)


OFFLINE_TRACES = {"bfcl_v3": 40.0, "lats": 40.0, "sharegpt": 10.0, "mixed": 10.0}
"""Traces of the offline table and their paper rates (hetero-1, 100 workflows an episode)."""


def offline_table(episodes: int, prefix_cache: bool) -> str:
    """Forecast error per trace: fitted on ``episodes`` episodes of the train half, scored on
    as many of the eval half (every workflow's rows at the decisions it was shown at)."""
    lines = ["| trace | test rows | log-RMSE H_w(t) | log-RMSE app-mean | log-RMSE learned | "
             "share of H_w ≤ q10 / q50 / q90 forecast |", "|---|---|---|---|---|---|"]
    for trace, rate in OFFLINE_TRACES.items():
        factory = EpisodeFactory(EpisodeConfig(cluster="hetero-1", trace=trace,
                                               num_workflows=100, arrival_rate=rate, load=None,
                                               prefix_cache=prefix_cache))
        err = offline_error(factory.horizon_rows("train", episodes),
                            factory.horizon_rows("eval", episodes, first_seed=0))
        lines.append(f"| {trace} | {int(err['rows'])} | {err['rmse_running']:.2f} | "
                     f"{err['rmse_app_mean']:.2f} | {err['rmse_learned']:.2f} | "
                     f"{err['coverage_0.1']:.2f} / {err['coverage_0.5']:.2f} / "
                     f"{err['coverage_0.9']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", default=",".join(CELLS),
                        help=f"comma-separated cells (default all: {', '.join(CELLS)})")
    parser.add_argument("--seeds", type=int, default=20, help="paired seeds per cell")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-prefix-cache", action="store_true",
                        help="serve without prefix caching (the paper-testbed regime)")
    parser.add_argument("--out", type=Path, default=Path("results/horizon_headroom"))
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--baselines", action="store_true",
                        help="also run the shipped baselines on the same episodes and print "
                             "the best of them beside hexagent and the learned forecast")
    parser.add_argument("--offline", type=int, nargs="?", const=4, metavar="EPISODES",
                        help="print only the forecast error per trace, fitted on EPISODES "
                             "episodes of the train half (default 4), scored on the eval half")
    args = parser.parse_args(argv)
    if args.offline is not None:
        if args.offline < 1:
            print("error: --offline needs >= 1 episode", file=sys.stderr)
            return 2
        print(offline_table(args.offline, not args.no_prefix_cache))
        return 0
    cells = [c.strip() for c in args.cells.split(",") if c.strip()]
    unknown = [c for c in cells if c not in CELLS]
    if unknown or args.seeds < 2 or args.workers < 1:
        why = (f"unknown cell(s) {', '.join(unknown)}; known: {', '.join(CELLS)}" if unknown
               else "--seeds must be >= 2 (paired intervals) and --workers >= 1")
        print(f"error: {why}", file=sys.stderr)
        return 2
    rows_by_cell: dict[str, list] = {}
    baseline_records: dict[str, list] = {}
    for cell in cells:
        try:
            exp = load_experiment(experiment_of(cell, list(range(args.seeds)),
                                                not args.no_prefix_cache))
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        ev = evaluate(exp, args.out / cell, resume=args.resume, workers=args.workers,
                      progress=False)
        print(f"## {cell}\n\n{report_text(ev)}\n", flush=True)
        if ev.failures:
            print(f"error: {len(ev.failures)} cell(s) of {cell} failed: "
                  f"{args.out / cell / 'failures.jsonl'}", file=sys.stderr)
            return 1
        rows_by_cell[cell] = summarize(ev.records, exp.report)
        if args.baselines:
            bexp = load_experiment(baselines_experiment(cell, list(range(args.seeds)),
                                                        not args.no_prefix_cache))
            bev = evaluate(bexp, args.out / cell / "baselines", resume=args.resume,
                           workers=args.workers, progress=False)
            if bev.failures:
                print(f"error: {len(bev.failures)} baseline cell(s) of {cell} failed: "
                      f"{args.out / cell / 'baselines' / 'failures.jsonl'}", file=sys.stderr)
                return 1
            baseline_records[cell] = bev.records
    print("## Req99 reduction of hexagent-horizon against hexagent (paired)\n")
    print(summary(rows_by_cell))
    print("\n## learned: Req95, Req99 and mean ratio (paired reduction against hexagent)\n")
    print(learned_summary(rows_by_cell))
    if baseline_records:
        print("\n## Req99: the shipped baselines, hexagent and the learned forecast\n")
        print(baselines_summary(baseline_records, rows_by_cell))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
