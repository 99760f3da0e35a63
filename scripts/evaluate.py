"""Evaluate schedulers over a grid of clusters, traces, loads and seeds; print the tables.

Usage:
    python scripts/evaluate.py --config configs/experiments/default.yaml --plot
    python scripts/evaluate.py atlas_ablation           # the experiment name alone works too
    python scripts/evaluate.py --policies hexagent,llf --traces bfcl_v3 --load 0.8,1.0 --seeds 0,1
    python scripts/evaluate.py --config table2_3 --quick
    python scripts/evaluate.py --config table6 --backend ray                 # local Ray, all cores
    python scripts/evaluate.py --config table1 --backend ray --address HEAD:6379   # a cluster
    python scripts/evaluate.py --policies hexagent --traces bfcl_v3 --seeds 0 --timeline out/
    python scripts/evaluate.py --traces mooncake.jsonl --replay   # every row, its own timestamps

Flags override the config's grid. Output goes to --out (default results/<experiment name>):
cells.jsonl (one line per finished cell; --resume skips those), results.json (table rows and
every cell with per-workflow ratios), tables.md, failures.jsonl (cells that raised), and with
--plot the PNG figures. A failed cell is reported with its parameters and error after the
tables, the other cells are kept, and the exit status is 1; --resume retries only the failed and
missing cells. --cell-timeout S fails a cell that runs longer than S seconds and goes on. Ctrl-C
(SIGINT) or SIGTERM keeps every finished cell, says how many in one line and exits with 130 / 143;
--resume continues. Schema and outputs: docs/evaluation.md; Ray: docs/distributed.md.

--timeline DIR runs one cell of the grid instead (the first, or the first of --timeline-policy)
with its timeline recorded and writes DIR/<cell>.json, a Chrome trace for https://ui.perfetto.dev,
and DIR/<cell>.png, a Gantt of its worst workflow (docs/timelines.md).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from hexagent_gym.config import ConfigError
from hexagent_gym.experiments import (
    BACKENDS,
    evaluate,
    format_failures,
    load_experiment,
    report_text,
    write_results,
)
from hexagent_gym.experiments.cell_log import OutputLocked
from hexagent_gym.experiments.cells import cell_episode
from hexagent_gym.experiments.grid import Experiment
from hexagent_gym.experiments.interrupts import RunInterrupted
from hexagent_gym.experiments.worker_pool import check_cell_timeout


def _list(kind: type):
    def parse(text: str) -> list:
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            hint = (" (to replay a trace's own arrival times instead of a load, use --replay)"
                    if text.strip().lower() in ("none", "null") else "")
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {kind.__name__}s, got {text!r}{hint}"
            ) from None
    return parse


def sampling_notes(exp: Experiment) -> list[str]:
    """One line per trace that carries its own arrival times but is sampled with Poisson
    arrivals in some cell (say so rather than silently not replaying it)."""
    from hexagent_gym.workload.workload import load_trace

    sampled: dict[str, str] = {}
    for cell in exp.cells():
        e = cell.episode
        if e.trace not in sampled and (e.arrival_rate is not None or e.load is not None):
            how = (f"{e.arrival_rate:g} workflows/s" if e.arrival_rate is not None
                   else f"offered load {e.load:g}")
            sampled[e.trace] = f"{e.num_workflows or 'all'} workflows at {how}"
    notes = []
    for trace, how in sampled.items():
        workflows = load_trace(trace).workflows
        if workflows and all(w.arrival_s is not None for w in workflows):
            notes.append(f"{trace} has its own arrival times, but this run samples {how} with "
                         f"Poisson arrivals; add --replay to replay every row at its timestamp")
    return notes


def write_timeline(exp: Experiment, out_dir: Path, policy: str | None = None,
                   workflow: str | None = None) -> tuple[Path, Path]:
    """Run one cell of ``exp`` with its timeline recorded; write its trace JSON and Gantt PNG.

    The cell is the grid's first, or the first whose policy name or label is ``policy``; it runs
    exactly as in an evaluation (same factory settings, seed and policy arguments), so its
    results equal the evaluation's. ``workflow`` is the Gantt's highlighted workflow: an episode
    index or a trace workflow id (None: the worst ratio).

    Returns:
        (trace JSON path, PNG path), named after the cell.

    Raises:
        ConfigError: no cell of the grid runs ``policy``.
        ValueError: ``workflow`` is not in the episode.
    """
    cells = exp.cells()
    if policy is not None:
        chosen = [c for c in cells if policy.lower() in (c.policy, c.label)]
        if not chosen:
            labels = sorted({c.label or c.policy for c in cells})
            raise ConfigError(f"--timeline-policy: no cell of {exp.name} runs {policy!r}; its "
                              f"policies: {', '.join(labels)}")
        cells = chosen
    cell = cells[0]
    result, _ = cell_episode(cell, record_timeline=True)
    timeline = result.timeline
    label = cell.label or cell.policy
    timeline.meta.update(policy=label, trace=cell.episode.trace)
    if workflow is not None and workflow.isdigit():
        workflow = int(workflow)  # an episode index; any other text is a trace workflow id
    e = cell.episode
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{label}-{e.cluster}-{Path(e.trace).stem}-"
                                             f"seed{e.seed}")
    png = out_dir / f"{stem}.png"
    timeline.save_gantt(png, workflow=workflow)
    trace = timeline.save_chrome_trace(out_dir / f"{stem}.json")
    w = timeline.worst_workflow() if workflow is None else timeline.workflow_index(workflow)
    info = timeline.workflows[w]
    path = " -> ".join(f"c{c}" for c in timeline.critical_path(w))
    print(f"timeline of {cell.describe()}: {len(timeline)} spans, Req99 {result.req99:.3f}; "
          f"Gantt of workflow w{w} ({info.workflow_id}), ratio {info.ratio:.3f}, critical path "
          f"{path}", file=sys.stderr)
    return trace, png


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", nargs="?",
                        help="experiment YAML path or shipped name (e.g. table1); same as "
                        "--config")
    parser.add_argument("--config", help="experiment YAML path or shipped name (e.g. table1)")
    parser.add_argument("--policies", type=_list(str), help="comma-separated policy names")
    parser.add_argument("--traces", type=_list(str), help="comma-separated trace names or paths")
    parser.add_argument("--clusters", type=_list(str), help="comma-separated cluster names")
    parser.add_argument("--seeds", type=_list(int), help="comma-separated seeds, e.g. 0,1,2")
    parser.add_argument("--num-workflows", type=int, help="workflows per episode (all traces)")
    parser.add_argument("--load", type=_list(float),
                        help="offered prefill load(s) ρ to sweep, e.g. 0.8,1.0")
    parser.add_argument("--replay", action="store_true",
                        help="replay each trace's own arrival times, every row in time order "
                             "(public traces with timestamps: Mooncake, Qwen-Bailian); with "
                             "--num-workflows or --quick, the first rows")
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
    parser.add_argument("--workers", type=int,
                        help="local backend: worker processes (default 1; cells sharing a "
                        "factory stay together). ray backend without --address: CPUs of the "
                        "local Ray instance (default: every core)")
    parser.add_argument("--backend", choices=BACKENDS, default="local",
                        help="local: this process or a process pool; ray: one Ray task per "
                        "chunk of cells (pip install 'hexagent-gym[distributed]')")
    parser.add_argument("--address",
                        help="ray: join this running cluster (HEAD:6379, auto, "
                        "ray://HEAD:10001) instead of starting a local Ray")
    parser.add_argument("--chunk-size", type=int,
                        help="ray: cells per task, cut from cells sharing a factory (0 = "
                        "whole factory groups; default: whole groups unless there are fewer "
                        "than 2 per CPU)")
    parser.add_argument("--ship-code", action="store_true",
                        help="ray: ship this checkout's packages to the workers (runtime_env "
                        "py_modules), for cluster nodes without the repository")
    parser.add_argument("--fail-fast", action="store_true",
                        help="stop at the first failing cell instead of running the others")
    parser.add_argument("--cell-timeout", type=float, metavar="SECONDS",
                        help="local backend: a cell running longer fails (CellTimeout in "
                        "failures.jsonl) and the grid goes on; its worker process is killed and "
                        "replaced (cells then run in worker processes, one without --workers)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--timeline", type=Path, metavar="DIR",
                        help="instead of evaluating the grid, run one cell (the grid's first "
                        "after the flags above; see --timeline-policy) with its timeline "
                        "recorded and write DIR/<cell>.json (Chrome trace: open it in "
                        "https://ui.perfetto.dev) and DIR/<cell>.png (Gantt of the worst "
                        "workflow); docs/timelines.md")
    parser.add_argument("--timeline-policy", metavar="NAME",
                        help="with --timeline: the first cell of this policy (name or grid "
                        "label) instead of the grid's first")
    parser.add_argument("--timeline-workflow", metavar="ID",
                        help="with --timeline: the workflow the Gantt highlights (episode index "
                        "or trace workflow id; default: the one with the worst ratio)")
    args = parser.parse_args(argv)
    if args.experiment is not None:
        if args.config is not None:
            parser.error("name the experiment once: positionally or with --config")
        args.config = args.experiment
    if args.backend != "ray":
        for flag in ("address", "chunk_size"):
            if getattr(args, flag) is not None:
                parser.error(f"--{flag.replace('_', '-')} needs --backend ray")
        if args.ship_code:
            parser.error("--ship-code needs --backend ray")
    elif args.address and args.workers is not None:
        parser.error("--workers sizes a local Ray instance; with --address the cluster's nodes "
                     "set their CPUs (ray start --num-cpus N)")
    if args.workers is not None and args.workers < 1:
        parser.error("--workers must be >= 1")
    try:
        check_cell_timeout(args.cell_timeout, "--cell-timeout")
    except ConfigError as exc:
        parser.error(str(exc))
    if args.cell_timeout is not None and args.backend == "ray":
        parser.error("--cell-timeout applies to the local backend only")
    if args.timeline is None:
        for flag in ("timeline_policy", "timeline_workflow"):
            if getattr(args, flag) is not None:
                parser.error(f"--{flag.replace('_', '-')} needs --timeline DIR")
    else:
        for flag, given in (("resume", args.resume), ("plot", args.plot),
                            ("backend ray", args.backend == "ray")):
            if given:
                parser.error(f"--timeline runs one cell here and evaluates no grid: drop "
                             f"--{flag}")
    try:
        exp = load_experiment(args.config)
        exp = exp.with_overrides(policies=args.policies, clusters=args.clusters,
                                 traces=args.traces, seeds=args.seeds,
                                 num_workflows=args.num_workflows, loads=args.load,
                                 estimation_errors=args.estimation_error, quick=args.quick,
                                 replay=args.replay)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for note in sampling_notes(exp):
        print(f"note: {note}", file=sys.stderr)
    if args.timeline is not None:
        try:
            paths = write_timeline(exp, args.timeline, args.timeline_policy,
                                   args.timeline_workflow)
        except (ConfigError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print("Wrote: " + ", ".join(str(p) for p in paths), file=sys.stderr)
        return 0
    out = args.out or Path("results") / exp.name
    if out.exists() and not out.is_dir():
        print(f"error: --out {out} is a file; give a directory (created if missing)",
              file=sys.stderr)
        return 2
    n = len(exp.cells())
    where = "" if args.backend == "local" else f" on Ray ({args.address or 'local instance'})"
    print(f"{exp.name}: {n} cells -> {out}{where}", file=sys.stderr)
    start = time.perf_counter()
    ray_init = None
    if args.ship_code:
        from hexagent_gym.experiments.ray_backend import code_runtime_env

        ray_init = {"runtime_env": code_runtime_env()}
    try:
        ev = evaluate(exp, out, resume=args.resume, workers=args.workers,
                      progress=not args.quiet, backend=args.backend, address=args.address,
                      chunk_size=args.chunk_size, fail_fast=args.fail_fast, ray_init=ray_init,
                      cell_timeout=args.cell_timeout)
    except (ImportError, ConnectionError) as exc:
        if args.backend != "ray":
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (ConfigError, OutputLocked) as exc:  # e.g. --seeds 0,0; another run on --out
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RunInterrupted as exc:  # SIGINT or SIGTERM: the finished cells are written
        print(exc.message(), file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:  # before the cells ran (e.g. while reading cells.jsonl)
        print(f"\ninterrupted: the finished cells are in {out / 'cells.jsonl'}; add --resume "
              f"to continue", file=sys.stderr)
        return 130
    paths = write_results(ev, out)
    print(report_text(ev))
    if args.plot:
        from hexagent_gym.experiments.plots import plot_evaluation

        paths += plot_evaluation(ev.records, args.plot_dir or out, prefix=f"{exp.name}_")
    elapsed = time.perf_counter() - start
    print(f"{ev.computed} cells run, {ev.reused} reused, {elapsed:.1f} s. Wrote: "
          + ", ".join(str(p) for p in paths), file=sys.stderr)
    if ev.failures:
        print(format_failures(ev.failures, n) + f"\n(tracebacks: {out / 'failures.jsonl'})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
