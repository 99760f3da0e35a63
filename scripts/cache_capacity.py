"""Prefix-cache hit rate and Req99 against the prefix cache's capacity (docs/prefix_cache.md).

Runs every trace at the paper's published arrival rate and size (ShareGPT 100 workflows @ 10/s,
BFCL-v3 400 @ 40/s, LATS 100 @ 40/s, Mixed 100 @ 10/s) once per cache capacity and policy, and
prints a markdown table: trace x capacity -> hit rate and Req99 per policy, next to the ideal hit
rate (unbounded cache, one instance, arrival order), the reuse inside workflows alone and the
floor that sample-group riders give.

Usage:
    python scripts/cache_capacity.py
    python scripts/cache_capacity.py --traces bfcl_v3 --block-tokens 64
    python scripts/cache_capacity.py --out table.md --plot hit_rate.png --workers 2
    python scripts/cache_capacity.py --quick

Capacities are tokens per prefill instance; "memory" sizes each cache from its instance's free
KV memory (the default), "inf" makes it unbounded and 0 keeps it empty.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from hexagent_gym.cluster.cluster import load_cluster
from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.policy import make_policy, run_policy
from hexagent_gym.workload.trace_formats import ideal_prefix_hit_rate

PAPER_RATES = {  # trace -> (workflows per episode, arrivals per second), as published
    "sharegpt": (100, 10.0),
    "bfcl_v3": (400, 40.0),
    "lats": (100, 40.0),
    "mixed": (100, 10.0),
}
DEFAULT_CAPACITIES = "0,4096,16384,65536,262144,memory,inf"
QUICK_WORKFLOWS = 20
QUICK_CAPACITIES = "0,inf"

Capacity = float | None  # tokens per instance; None = sized from memory; math.inf = unbounded


# -- parsing and labels -------------------------------------------------------------------------

def parse_capacity(text: str) -> Capacity:
    """``"memory"`` -> None, ``"inf"`` -> math.inf, else a number of tokens >= 0."""
    t = text.strip().lower()
    if t == "memory":
        return None
    if t in ("inf", "infinity", "unbounded"):
        return math.inf
    try:
        value = int(t.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"capacity must be a number of tokens, 'memory' or 'inf', got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"capacity must be >= 0 tokens, got {value}")
    return value


def capacity_label(cap: Capacity) -> str:
    """The capacity as the table prints it: ``0``, ``4096``, ``memory``, ``inf``."""
    if cap is None:
        return "memory"
    if math.isinf(cap):
        return "inf"
    return str(int(cap))


def _list(kind):
    def parse(text: str) -> list:
        return [kind(x) for x in text.split(",") if x.strip()]
    return parse


# -- one trace x capacity -----------------------------------------------------------------------

@dataclass
class Row:
    """Results of one (trace, capacity), averaged over seeds."""

    trace: str
    capacity: Capacity
    ideal: float = math.nan
    own: float = math.nan
    riders: float = math.nan
    hit: dict[str, float] = field(default_factory=dict)
    req99: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return capacity_label(self.capacity)


def episode_config(cluster: str, trace: str, capacity: Capacity, block_tokens: int,
                   quick: bool) -> EpisodeConfig:
    """The trace at the paper's rate and size (``quick``: only a few workflows)."""
    n, rate = PAPER_RATES.get(trace, (100, 10.0))
    if quick:
        n = QUICK_WORKFLOWS
    return EpisodeConfig(cluster=cluster, trace=trace, num_workflows=n, load=None,
                         arrival_rate=rate, prefix_cache_tokens=capacity,
                         prefix_block_tokens=block_tokens)


def own_share(workflows) -> float:
    """Share of prompt tokens that earlier prompts of the same workflow hold: the reuse a
    workflow finds alone on a cold, unbounded cache (its standalone horizon H_w uses it)."""
    total = own = 0
    for wf in workflows:
        for c in wf.calls:
            total += c.input_tokens
            own += c.own_hit
    return own / total if total else 0.0


def rider_share(workflows) -> float:
    """Share of prompt tokens belonging to sample-group riders: a group's leader prefills them,
    so they count as served from cache at any capacity (the hit rate's floor)."""
    total = riders = 0
    for wf in workflows:
        for i, c in enumerate(wf.calls):
            total += c.input_tokens
            if c.group >= 0 and c.group != i:
                riders += c.input_tokens
    return riders / total if total else 0.0


def run_row(cluster: str, trace: str, capacity: Capacity, block_tokens: int,
            policies: Sequence[str], seeds: Sequence[int], quick: bool) -> Row:
    """Every policy and seed on one (trace, capacity); one factory, so horizons are shared."""
    factory = EpisodeFactory(episode_config(cluster, trace, capacity, block_tokens, quick))
    row = Row(trace, capacity)
    ideal, own, riders = [], [], []
    for seed in seeds:
        workflows = factory.workload(seed)[0].workflows  # arrival order
        ideal.append(ideal_prefix_hit_rate(workflows))
        own.append(own_share(workflows))
        riders.append(rider_share(workflows))
    row.ideal, row.own, row.riders = _mean(ideal), _mean(own), _mean(riders)
    for name in policies:
        results = [run_policy(factory.simulator(seed), make_policy(name), close=True)
                   for seed in seeds]
        row.hit[name] = _mean([r.prefix_hit_rate for r in results])
        row.req99[name] = _mean([r.req99 for r in results])
    return row


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


# -- the grid -----------------------------------------------------------------------------------

def run_grid(cluster: str, traces: Sequence[str], capacities: Sequence[Capacity],
             block_tokens: int, policies: Sequence[str], seeds: Sequence[int], quick: bool,
             workers: int = 1, progress: bool = True) -> list[Row]:
    """All (trace, capacity) rows, in trace then capacity order."""
    tasks = [(cluster, t, c, block_tokens, tuple(policies), tuple(seeds), quick)
             for t in traces for c in capacities]
    rows: dict[int, Row] = {}
    bar = _progress(len(tasks), progress)
    if workers <= 1 or len(tasks) <= 1:
        for i, task in enumerate(tasks):
            rows[i] = run_row(*task)
            bar.update()
    else:
        # longest traces first so the pool does not wait on one straggler at the end
        order = sorted(range(len(tasks)), key=lambda i: -_cost(tasks[i][1], quick))
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(run_row, *tasks[i]): i for i in order}
            for fut in as_completed(futures):
                rows[futures[fut]] = fut.result()
                bar.update()
    bar.close()
    return [rows[i] for i in range(len(tasks))]


def _cost(trace: str, quick: bool) -> float:
    """Rough relative run time of one row (bfcl_v3 and lats dominate the default grid)."""
    n = QUICK_WORKFLOWS if quick else PAPER_RATES.get(trace, (100, 10.0))[0]
    return {"bfcl_v3": 4.0, "lats": 3.0, "mixed": 1.0}.get(trace, 0.5) * n


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="trace x capacity", unit="row", file=sys.stderr,
                disable=not enabled or total < 4)


# -- output -------------------------------------------------------------------------------------

def kv_span(cluster: str) -> tuple[int, int]:
    """Smallest and largest KV tokens of the cluster's prefill instances (the 'memory' cache)."""
    kv = [inst.kv_capacity_tokens for inst in load_cluster(cluster).prefill]
    return min(kv), max(kv)


def format_table(rows: Sequence[Row], policies: Sequence[str]) -> str:
    """Markdown table: one row per (trace, capacity)."""
    head = (["trace", "capacity", "ideal", "own", "riders"] + [f"hit {p}" for p in policies]
            + [f"Req99 {p}" for p in policies])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.trace, r.label, f"{r.ideal:.3f}", f"{r.own:.3f}", f"{r.riders:.3f}"]
        cells += [f"{r.hit[p]:.3f}" for p in policies]
        cells += [f"{r.req99[p]:.2f}" for p in policies]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def describe(cluster: str, traces: Sequence[str], block_tokens: int, seeds: Sequence[int],
             quick: bool) -> str:
    """One line of what the table ran."""
    lo, hi = kv_span(cluster)
    memory = f"{lo:,}" if lo == hi else f"{lo:,}–{hi:,}"
    sizes = ", ".join(
        f"{t} {QUICK_WORKFLOWS if quick else PAPER_RATES.get(t, (100, 10.0))[0]} @ "
        f"{PAPER_RATES.get(t, (100, 10.0))[1]:g}/s" for t in traces)
    return (f"{cluster}, {block_tokens}-token blocks, seeds {', '.join(map(str, seeds))}; "
            f"{sizes}. Capacity in tokens per prefill instance (memory = the instance's free KV "
            f"memory, {memory} tokens). Hit rate = prompt tokens served from cache / prompt "
            "tokens. ideal: unbounded cache, one instance, arrival order. own: reuse of the "
            "workflow's own earlier prompts only (unbounded). riders: sample-group riders' share "
            "of prompt tokens (served by their leader's prefill at any capacity). Req99 is "
            "against H_w with a cold cache of the same capacity.")


def plot(rows: Sequence[Row], policies: Sequence[str], cluster: str, block_tokens: int,
         path: Path) -> None:
    """Hit rate (left) and Req99 (right) against capacity: one line per trace x policy."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    lo, hi = kv_span(cluster)
    caps = []
    for r in rows:
        if r.capacity not in caps:  # None == None, inf == inf
            caps.append(r.capacity)
    pos = _positions(caps, lo, hi)
    traces = list(dict.fromkeys(r.trace for r in rows))
    colors = {t: plt.get_cmap("tab10")(i) for i, t in enumerate(traces)}
    styles = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D")]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    for ax, metric, title in ((axes[0], "hit", "prefix hit rate"),
                              (axes[1], "req99", "Req99 (C_w / H_w)")):
        if "memory" in pos:
            ax.axvspan(lo * 0.97, hi * 1.03, color="0.9", zorder=0)
        for t in traces:
            mine = [r for r in rows if r.trace == t]
            xs = [pos[capacity_key(r.capacity)] for r in mine]
            for k, p in enumerate(policies):
                ls, marker = styles[k % len(styles)]
                ys = [getattr(r, metric)[p] for r in mine]
                ax.plot(xs, ys, ls, marker=marker, color=colors[t], lw=1.8, ms=5)
            if metric == "hit":
                ax.axhline(mine[0].ideal, color=colors[t], lw=1.0, ls=(0, (1, 3)))
        ax.set_xscale("log")
        ticks = sorted(pos.items(), key=lambda kv: kv[1])
        ax.set_xticks([x for _, x in ticks])
        ax.set_xticklabels([_tick_label(c, lo, hi) for c, _ in ticks])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel("prefix cache capacity per prefill instance (tokens)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylim(-0.02, 1.0)
    axes[0].set_ylabel("tokens served from cache / prompt tokens")
    axes[1].set_yscale("log")
    axes[1].yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    axes[1].yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axes[1].yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axes[1].set_ylabel("Req99 (lower is better)")
    trace_handles = [Line2D([], [], color=colors[t], lw=3, label=t) for t in traces]
    policy_handles = [Line2D([], [], color="0.3", ls=styles[k % len(styles)][0],
                             marker=styles[k % len(styles)][1], label=p)
                      for k, p in enumerate(policies)]
    ideal_handle = [Line2D([], [], color="0.3", lw=1.0, ls=(0, (1, 3)),
                           label="ideal (unbounded, one instance)")]
    handles = trace_handles + policy_handles + ideal_handle
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=9,
               frameon=False)
    fig.suptitle(f"Prefix cache capacity on {cluster} ({block_tokens}-token blocks, the paper's "
                 "arrival rates); shaded: the prefill instances' KV memory", fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def capacity_key(cap: Capacity):
    """A hashable key per capacity (None, inf and numbers)."""
    return "memory" if cap is None else cap


def _positions(caps: Sequence[Capacity], lo: int, hi: int) -> dict:
    """x positions on a log axis: 0 at the left edge, memory between the instances' KV sizes,
    inf at the right edge."""
    finite = [c for c in caps if c is not None and not math.isinf(c) and c > 0]
    top = max(finite + ([hi] if None in caps else []), default=1024.0)
    bottom = min(finite + ([lo] if None in caps else []), default=top)
    pos = {}
    for c in caps:
        if c is None:
            pos["memory"] = math.sqrt(lo * hi)
        elif math.isinf(c):
            pos[c] = top * 4.0
        elif c == 0:
            pos[c] = bottom / 4.0
        else:
            pos[c] = float(c)
    return pos


def _tick_label(key, lo: int, hi: int) -> str:
    if key == "memory":
        return f"memory\n{_short(lo)}–{_short(hi)}" if lo != hi else f"memory\n{_short(lo)}"
    if math.isinf(key):
        return "∞"
    return _short(key)


def _short(tokens: float) -> str:
    """Compact token count: 4096 -> 4K (binary for powers of two), 456511 -> 0.46M."""
    if tokens >= 1024 and tokens % 1024 == 0 and tokens < 1024 * 1024:
        return f"{int(tokens) // 1024}K"
    if tokens >= 100_000:
        return f"{tokens / 1e6:.2g}M"
    if tokens >= 1000:
        return f"{tokens / 1e3:.3g}k"
    return f"{tokens:g}"


# -- entry point --------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="hetero-1")
    parser.add_argument("--traces", type=_list(str), default=list(PAPER_RATES),
                        help="comma-separated traces (default: all four; a trace without a "
                             "published rate runs 100 workflows @ 10/s)")
    parser.add_argument("--policies", type=_list(str), default=["hexagent", "fcfs"],
                        help="comma-separated policy names (default: hexagent,fcfs)")
    parser.add_argument("--capacities", type=_list(parse_capacity), default=None,
                        help=f"comma-separated tokens per prefill instance, 'memory' or 'inf' "
                             f"(default: {DEFAULT_CAPACITIES})")
    parser.add_argument("--block-tokens", type=int, default=512, help="tokens per prompt block")
    parser.add_argument("--seeds", type=_list(int), default=[0], help="comma-separated seeds")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                        help="worker processes (default: 2, or 1 on a single core)")
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    parser.add_argument("--plot", type=Path, help="write the hit-rate / Req99 plot to this PNG")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke run: {QUICK_WORKFLOWS} workflows per episode and capacities "
                             f"{QUICK_CAPACITIES} (unless --capacities is given)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.block_tokens < 1:
        parser.error(f"--block-tokens must be >= 1, got {args.block_tokens}")
    if not args.traces or not args.policies or not args.seeds:
        parser.error("--traces, --policies and --seeds need at least one value each")
    capacities = args.capacities or _list(parse_capacity)(
        QUICK_CAPACITIES if args.quick else DEFAULT_CAPACITIES)

    start = time.perf_counter()
    rows = run_grid(args.cluster, args.traces, capacities, args.block_tokens, args.policies,
                    args.seeds, args.quick, args.workers, not args.no_progress)
    wall = time.perf_counter() - start
    text = (describe(args.cluster, args.traces, args.block_tokens, args.seeds, args.quick)
            + "\n\n" + format_table(rows, args.policies) + "\n")
    print(text)
    print(f"{len(rows)} rows x {len(args.policies)} policies x {len(args.seeds)} seeds in "
          f"{wall:.1f} s wall ({args.workers} worker{'s' if args.workers != 1 else ''})")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    if args.plot is not None:
        plot(rows, args.policies, args.cluster, args.block_tokens, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
