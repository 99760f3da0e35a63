"""Figures of an evaluation: attainment curves (the paper's Figures 3–4) and load sweeps.

Both take cell records (:func:`hexagent_gym.experiments.cells.run_cell`), so they work on a live
:class:`~hexagent_gym.experiments.result.Evaluation` or on a ``results.json`` read back from
disk. A line is a policy label (the policy name unless the grid entry has a label).
matplotlib is imported lazily with the non-interactive Agg backend, so importing this module
costs nothing and plotting works without a display.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hexagent_gym.experiments.cells import policy_label
from hexagent_gym.experiments.stats import Stat, summarize

_STYLE = {
    "hexagent": {"color": "#d62728", "lw": 2.4, "zorder": 5},
    "fcfs": {"color": "#7f7f7f", "lw": 1.5},
    "wf-fcfs": {"color": "#8c564b", "lw": 1.5},
    "llf": {"color": "#1f77b4", "lw": 1.5},
    "atlas": {"color": "#2ca02c", "lw": 1.5},
    "random": {"color": "#9467bd", "lw": 1.2, "ls": ":"},
    "fallback": {"color": "#000000", "lw": 1.2, "ls": "--"},
    "hexagent-lookahead": {"color": "#ff7f0e", "lw": 1.8, "ls": "--", "zorder": 6},
    "learned": {"color": "#17becf", "lw": 2.0, "zorder": 7},
    "sglang-router": {"color": "#e377c2", "lw": 1.5},
    "hexagent-nocache": {"color": "#bcbd22", "lw": 1.8, "ls": "--", "zorder": 4},
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _policies(records: Sequence[Mapping[str, Any]]) -> list[str]:
    out: list[str] = []
    for r in records:
        p = policy_label(r["cell"])
        if p not in out:
            out.append(p)
    return out


def _panel_title(ep: Mapping[str, Any], rec: Mapping[str, Any]) -> str:
    load = rec.get("offered_load")
    n = ep["num_workflows"]
    bits = [str(ep["trace"])]
    if load is not None:
        bits.append(f"ρ={load:.2f}")
    if n is not None:
        bits.append(f"n={n}")
    return ", ".join(bits)


def attainment_figure(records: Sequence[Mapping[str, Any]], path: str | Path, *,
                      title: str | None = None, alpha_max: float | None = None,
                      policies: Sequence[str] | None = None) -> Path:
    """Fraction of workflows meeting α·H_w against α: one panel per (trace, load, size), one
    line per policy, ratios pooled over seeds.

    Args:
        records: cell records; each distinct (trace, load, number of workflows) is a panel.
        path: PNG file to write.
        title: figure title.
        alpha_max: right end of the α axes (default, per panel: a little past the largest
            99th-percentile ratio drawn, capped at 30 and at least 1.5).
        policies: which policies to draw and in which order (default: all, in record order).
    """
    plt = _pyplot()
    panels: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        ep = r["cell"]["episode"]
        key = json.dumps([ep["trace"], ep["load"], ep["arrival_rate"], ep["num_workflows"]])
        panels.setdefault(key, []).append(r)
    policies = list(policies) if policies is not None else _policies(records)
    pooled = {k: {p: np.concatenate([np.asarray(r["workflows"]["ratio"]) for r in recs
                                     if policy_label(r["cell"]) == p] or [np.zeros(0)])
                  for p in policies} for k, recs in panels.items()}
    def right_end(key: str) -> float:
        if alpha_max is not None:
            return alpha_max
        top = [np.quantile(v, 0.99) for v in pooled[key].values() if len(v)]
        return min(30.0, max(1.5, 1.1 * max(top, default=1.5)))

    n = len(panels)
    ncols = min(n, 4)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 3.0 * nrows), squeeze=False,
                             sharey=True)
    for ax, (key, recs) in zip(axes.flat, panels.items(), strict=False):
        right = right_end(key)
        alphas = np.linspace(1.0, right, 400)
        for p in policies:
            ratios = pooled[key][p]
            if not len(ratios):
                continue
            r = np.sort(ratios)
            frac = np.searchsorted(r, alphas, side="right") / len(r)
            ax.plot(alphas, frac, label=p, **_STYLE.get(p, {}))
        ax.axhline(0.99, color="0.6", lw=0.8, ls="--")
        ax.axhline(0.95, color="0.8", lw=0.8, ls="--")
        ax.set_title(_panel_title(recs[0]["cell"]["episode"], recs[0]), fontsize=10)
        ax.set_xlim(1.0, right)
        ax.set_ylim(0.0, 1.02)
        ax.set_xlabel("SLO scale α")
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("workflows meeting α·H_w")
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    # about two legend entries fit per panel width; wrap the rest onto more rows
    per_row = max(3, min(len(labels), 2 * ncols))
    legend_rows = math.ceil(len(labels) / per_row)
    fig.legend(handles, labels, loc="lower center", ncol=per_row, frameon=False,
               bbox_to_anchor=(0.5, 0.0))
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, (0.07 if nrows == 1 else 0.04) * legend_rows, 1, 1))
    return _save(fig, plt, path)


def load_sweep_figure(records: Sequence[Mapping[str, Any]], path: str | Path, *,
                      metric: str = "req99", title: str | None = None, log_y: bool = True,
                      policies: Sequence[str] | None = None) -> Path:
    """A metric (default Req99) against offered load ρ, one line per policy with 95% CI bars.

    The top axis gives the matching arrival rate (workflows/s); ρ is proportional to it for a
    fixed cluster and trace. ``records`` should share cluster and trace and differ in load.
    """
    plt = _pyplot()
    rows = summarize(records)
    rows = [r for r in rows if r.offered_load is not None]
    if not rows:
        raise ValueError("a load sweep needs records with an offered load (Poisson arrivals)")
    rows.sort(key=lambda r: r.offered_load)
    policies = list(policies) if policies is not None else _policies(records)
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    x = np.array([r.offered_load for r in rows])
    for p in policies:
        stats = [r.stats[p][metric] if p in r.stats else Stat(math.nan, math.nan, 0)
                 for r in rows]
        y = np.array([s.mean for s in stats])
        err = np.array([0.0 if math.isnan(s.ci) else s.ci for s in stats])
        style = dict(_STYLE.get(p, {}))
        ax.errorbar(x, y, yerr=err, label=p, marker="o", ms=3.5, capsize=2.5, **style)
    per_unit = rows[0].arrival_rate / rows[0].offered_load  # wf/s per unit of ρ
    top = ax.secondary_xaxis("top", functions=(lambda v: v * per_unit, lambda v: v / per_unit))
    top.set_xlabel("arrival rate (workflows/s)")
    ax.set_xlabel("offered prefill load ρ")
    ax.set_ylabel(metric.replace("req", "Req") + " (α)")
    if log_y:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plt.matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(plt.matplotlib.ticker.NullFormatter())
        means = [(r.stats[p][metric].mean, r.stats[p][metric].ci) for r in rows
                 for p in policies if p in r.stats]
        lo = min(1.0, np.nanmin([m for m, _ in means]))
        hi = np.nanmax([m + (0.0 if math.isnan(c) else c) for m, c in means])
        ax.set_ylim(0.95 * lo, 1.15 * hi)  # ratios are >= 1: CI bars below that carry no news
        ticks = [t for t in (1, 1.5, 2, 3, 5, 7, 10, 15, 20, 30, 50, 100)
                 if 0.95 * lo <= t <= 1.15 * hi]
        ax.set_yticks(ticks)
    ax.grid(alpha=0.3, which="both")
    ax.legend(frameon=False)
    if title:
        ax.set_title(title, fontsize=10, pad=28)
    fig.tight_layout()
    return _save(fig, plt, path)


def plot_evaluation(records: Sequence[Mapping[str, Any]], out_dir: str | Path,
                    prefix: str = "") -> list[Path]:
    """Every figure an evaluation supports, written to ``out_dir``.

    - ``{prefix}attainment_<cluster>[_err<e>][_<variant>].png``: attainment curves, one per
      cluster, estimation-error level and variant, with a panel per trace (and per load).
    - ``{prefix}load_sweep_<cluster>_<trace>[...].png``: Req99 against load, for every cluster
      and trace evaluated at two or more loads.
    """
    out = Path(out_dir)
    figs: dict[str, list[Mapping[str, Any]]] = {}
    sweeps: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        ep = r["cell"]["episode"]
        suffix = ""
        if ep["estimation_error"]:
            suffix += f"_err{ep['estimation_error']:g}"
        if ep["planning_latency"]:
            suffix += f"_pl{ep['planning_latency']}"
        if ep["max_calls_per_decision"] is not None:
            suffix += f"_k{ep['max_calls_per_decision']}"
        if r["cell"]["variant"]:
            suffix += f"_{r['cell']['variant']}"
        figs.setdefault(f"attainment_{_slug(ep['cluster'])}{suffix}", []).append(r)
        sweeps.setdefault(f"load_sweep_{_slug(ep['cluster'])}_{_slug(ep['trace'])}"
                          f"_n{ep['num_workflows']}{suffix}", []).append(r)
    paths = []
    for name, recs in figs.items():
        ep = recs[0]["cell"]["episode"]
        title = f"Workflow SLO attainment on {ep['cluster']}"
        if ep["estimation_error"]:
            title += f" (estimation error {ep['estimation_error']:g})"
        paths.append(attainment_figure(recs, out / f"{prefix}{name}.png", title=title))
    for name, recs in sweeps.items():
        loads = {r.get("offered_load") for r in recs}
        if len(loads) < 2 or None in loads:
            continue
        ep = recs[0]["cell"]["episode"]
        paths.append(load_sweep_figure(
            recs, out / f"{prefix}{name}.png",
            title=f"{ep['trace']} on {ep['cluster']} ({ep['num_workflows']} workflows)"))
    return paths


def _slug(text: Any) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(str(text)).stem if "/" in str(text)
                  else str(text)).strip("-")


def _save(fig: Any, plt: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")  # never crop a wide legend
    plt.close(fig)
    return path
