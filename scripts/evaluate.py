"""Evaluate schedulers over a grid of clusters, traces, loads and seeds; print the tables.

Usage:
    python scripts/evaluate.py --config configs/experiments/default.yaml --plot
    python scripts/evaluate.py --policies hexagent,llf --traces bfcl_v3 --load 0.8,1.0 --seeds 0,1
    python scripts/evaluate.py --config table2_3 --quick

Flags override the config's grid. Output goes to --out (default results/<experiment name>):
cells.jsonl (one line per finished cell; --resume skips those), results.json (table rows and
every cell with per-workflow ratios), tables.md, and with --plot the PNG figures.
Schema and outputs: docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hexagent_gym.config import ConfigError
from hexagent_gym.evaluation import evaluate, load_experiment, report_text, write_results


def _list(kind: type):
    def parse(text: str) -> list:
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {kind.__name__}s, got {text!r}") from None
    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="experiment YAML path or shipped name (e.g. table1)")
    parser.add_argument("--policies", type=_list(str), help="comma-separated policy names")
    parser.add_argument("--traces", type=_list(str), help="comma-separated trace names or paths")
    parser.add_argument("--clusters", type=_list(str), help="comma-separated cluster names")
    parser.add_argument("--seeds", type=_list(int), help="comma-separated seeds, e.g. 0,1,2")
    parser.add_argument("--num-workflows", type=int, help="workflows per episode (all traces)")
    parser.add_argument("--load", type=_list(float),
                        help="offered prefill load(s) ρ to sweep, e.g. 0.8,1.0")
    parser.add_argument("--estimation-error", type=_list(float),
                        help="estimation-error level(s) to sweep, e.g. 0,0.1,0.2")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: first seed only, at most 50 workflows per episode")
    parser.add_argument("--out", type=Path,
                        help="output directory (default results/<experiment name>)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the finished cells of --out/cells.jsonl, run the rest")
    parser.add_argument("--plot", action="store_true", help="write PNG figures")
    parser.add_argument("--plot-dir", type=Path,
                        help="where the PNGs (named <experiment>_*.png) go (default --out)")
    parser.add_argument("--workers", type=int, default=1,
                        help="worker processes (default 1; cells sharing a factory stay together)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        exp = load_experiment(args.config)
        exp = exp.with_overrides(policies=args.policies, clusters=args.clusters,
                                 traces=args.traces, seeds=args.seeds,
                                 num_workflows=args.num_workflows, loads=args.load,
                                 estimation_errors=args.estimation_error, quick=args.quick)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = args.out or Path("results") / exp.name
    n = len(exp.cells())
    print(f"{exp.name}: {n} cells -> {out}", file=sys.stderr)
    start = time.perf_counter()
    ev = evaluate(exp, out, resume=args.resume, workers=args.workers, progress=not args.quiet)
    paths = write_results(ev, out)
    print(report_text(ev))
    if args.plot:
        from hexagent_gym.plots import plot_evaluation

        paths += plot_evaluation(ev.records, args.plot_dir or out, prefix=f"{exp.name}_")
    elapsed = time.perf_counter() - start
    print(f"{ev.computed} cells run, {ev.reused} reused, {elapsed:.1f} s. Wrote: "
          + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
