"""Validate the paper-testbed experiments against the HexAgent paper's table numbers.

Usage:
    python scripts/validate_paper.py --workers 1                  # run paper_table* and report
    python scripts/validate_paper.py --from results/paper_validation   # report existing runs
    python scripts/validate_paper.py --quick --min-within 0       # small CI version
    python scripts/validate_paper.py --tables table1              # one table group only

Runs (or, with --from DIR, reads DIR/<experiment>/results.json of) the experiments that answer
the paper's numbers in configs/paper/tables.yaml (configs/experiments/paper_table1.yaml,
paper_table2_3.yaml, paper_table4.yaml: the paper-testbed preset) and prints every paper number
side by side with ours, the ratio ours/paper, the count within 0.8–1.25× per table, the
per-cluster reduction patterns and a verdict per claim. Cells shared by two experiments
(paper_table1's clusters are in paper_table2_3 too) run once. Exit status: 0; 1 when a cell
failed or fewer paper numbers than --min-within are within range; 2 for a bad file or name.

Verdict rule (in full, with the definitions, in hexagent_gym/experiments/paper_validation.py):
a paper number and ours *agree* when 0.8 <= ours/paper <= 1.25 (a range: to its nearer end);
otherwise they *agree in direction* when ours has the paper's sign (a reduction's sign; a
cell's side of HexAgent in its row), else they *do not agree*. A direction without a number
(Table 1's ordering) *agrees* when it holds in every row, *in part* in some, not in none. Ours
for a reduction is HexAgent against the best (lowest seed-mean) of every shipped baseline the
experiment ran in that row; the report names it, and adds the paper's own baseline set.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from hexagent_gym.config import ConfigError
from hexagent_gym.experiments import (
    CELLS_FILE,
    RESULTS_FILE,
    Experiment,
    evaluate,
    format_failures,
    load_experiment,
    read_cells,
    write_results,
)
from hexagent_gym.experiments.paper_report import format_report
from hexagent_gym.experiments.paper_tables import PaperTables, load_paper_tables
from hexagent_gym.experiments.paper_validation import evaluate_claims, total_within

QUICK_TRACES = ("sharegpt", "bfcl_v3")
QUICK_WORKFLOWS = 20


def _list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def experiments_of(tables: PaperTables) -> list[str]:
    """The experiments that answer the tables' claims, each once, in file order."""
    names: list[str] = []
    for t in tables.tables:
        if t.experiment and t.claims and t.experiment not in names:
            names.append(t.experiment)
    return names


def shrink(exp: Experiment, args: argparse.Namespace) -> Experiment:
    """The experiment with the command line's overrides; ``--quick``: the grid's first cluster,
    ShareGPT and BFCL-v3, the first seed, at most 20 workflows per episode."""
    clusters = _list(args.clusters) if args.clusters else None
    traces = _list(args.traces) if args.traces else None
    if args.quick:
        clusters = clusters or list((exp.grid.clusters or (exp.grid.base.cluster,))[:1])
        traces = traces or [t for t in (exp.grid.traces or ()) if t in QUICK_TRACES] or None
    seeds = [int(s) for s in _list(args.seeds)] if args.seeds else None
    return exp.with_overrides(clusters=clusters, traces=traces, seeds=seeds,
                              num_workflows=args.num_workflows, quick=args.quick,
                              quick_workflows=QUICK_WORKFLOWS)


def run_experiments(names: list[str], args: argparse.Namespace
                    ) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Run each experiment into OUT/<name>; a cell already computed by an earlier experiment of
    this invocation (or, with --resume, by an earlier run) is reused, not run again.

    Returns:
        (records per experiment, failure reports).
    """
    out_root = args.out
    done: dict[str, dict[str, Any]] = {}
    records: dict[str, list[dict[str, Any]]] = {}
    failures: list[str] = []
    for name in names:
        exp = shrink(load_experiment(name), args)
        out = out_root / name
        out.mkdir(parents=True, exist_ok=True)
        cells_file = out / CELLS_FILE
        if not args.resume:
            cells_file.write_text("", encoding="utf-8")  # no stale records of older code
        keys = {c.key for c in exp.cells()}
        have = read_cells(cells_file)
        shared = [r for k, r in done.items() if k in keys and k not in have]
        if shared:
            with cells_file.open("a", encoding="utf-8") as f:
                for r in shared:
                    f.write(json.dumps(r, separators=(",", ":")) + "\n")
        print(f"{name}: {len(keys)} cells ({len(shared)} shared with earlier experiments) -> "
              f"{out}", file=sys.stderr)
        ev = evaluate(exp, out, resume=True, workers=args.workers, progress=not args.quiet)
        write_results(ev, out)
        records[name] = ev.records
        done.update({r["key"]: r for r in ev.records})
        if ev.failures:
            failures.append(format_failures(ev.failures, len(keys)))
    return records, failures


def read_experiments(names: list[str], root: Path) -> dict[str, list[dict[str, Any]]]:
    """Cell records of each experiment from ROOT/<name>/results.json (else its cells.jsonl, a
    run still in progress), or ROOT/results.json when that is the experiment."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name in names:
        for path in (root / name / RESULTS_FILE, root / RESULTS_FILE):
            if path.is_file():
                data = json.loads(path.read_text(encoding="utf-8"))
                if data.get("experiment") == name:
                    out[name] = list(data.get("cells", []))
                    break
        else:
            partial = read_cells(root / name / CELLS_FILE)
            if partial:
                print(f"note: {name}: no {RESULTS_FILE}, reading {len(partial)} records of "
                      f"{root / name / CELLS_FILE}", file=sys.stderr)
                out[name] = list(partial.values())
            else:
                print(f"note: {name}: no results under {root}; its claims are not run",
                      file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paper", type=Path, help="paper numbers YAML (default "
                        "configs/paper/tables.yaml)")
    parser.add_argument("--tables", help="comma-separated table groups of the data file "
                        "(default: all), e.g. table1,table4")
    parser.add_argument("--from", dest="from_dir", type=Path, metavar="DIR",
                        help="read DIR/<experiment>/results.json instead of running")
    parser.add_argument("--out", type=Path, help="where the runs go (default "
                        "results/paper_validation, with --quick results/paper_validation_quick)")
    parser.add_argument("--quick", action="store_true",
                        help="small version for CI: each grid's first cluster, ShareGPT and "
                             "BFCL-v3, first seed, at most 20 workflows per episode")
    parser.add_argument("--clusters", help="comma-separated clusters (every experiment)")
    parser.add_argument("--traces", help="comma-separated traces (every experiment)")
    parser.add_argument("--seeds", help="comma-separated seeds (every experiment)")
    parser.add_argument("--num-workflows", type=int, help="workflows per episode, everywhere")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the finished cells of OUT/<experiment>/cells.jsonl")
    parser.add_argument("--min-within", type=int, metavar="N",
                        help="exit 1 when fewer than N paper numbers are within 0.8-1.25x")
    parser.add_argument("--report", type=Path, metavar="FILE",
                        help="also write the report here (a run writes OUT/validation.md)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    if args.from_dir is not None:
        given = [f for f in ("quick", "resume", "clusters", "traces", "seeds", "num_workflows",
                             "out") if getattr(args, f)]
        if given:
            parser.error(f"--from reads finished runs: drop --{given[0].replace('_', '-')}")
    args.out = args.out or Path("results") / ("paper_validation_quick" if args.quick
                                              else "paper_validation")
    start = time.perf_counter()
    try:
        tables = load_paper_tables(args.paper)
        tables = tables.select(_list(args.tables) if args.tables else None)
        names = experiments_of(tables)
        if args.from_dir is not None:
            records = read_experiments(names, args.from_dir)
            failures: list[str] = []
            if not records:
                print(f"error: no results of {', '.join(names)} under {args.from_dir}",
                      file=sys.stderr)
                return 2
        else:
            records, failures = run_experiments(names, args)
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    outcomes = evaluate_claims(tables, records)
    text = format_report(tables, records, outcomes)
    print(text, end="")
    targets = [args.report] if args.report else []
    if args.from_dir is None:
        targets.append(args.out / "validation.md")
    for path in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    print(f"{time.perf_counter() - start:.1f} s" + (
        f"; wrote {', '.join(str(p) for p in targets)}" if targets else ""), file=sys.stderr)
    status = 0
    for report in failures:
        print(report, file=sys.stderr)
        status = 1
    if args.min_within is not None:
        got = total_within(outcomes)
        if got < args.min_within:
            print(f"FAILED: {got} paper numbers within 0.8-1.25x, below the floor "
                  f"--min-within {args.min_within}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
