"""How a timeline is laid out: Chrome-trace tracks and the Gantt PNG (docs/timelines.md).

Separate from :mod:`hexagent_gym.sim.timeline` (the spans and their queries), which imports it.
Works on any timeline-like object (``spans`` with ``kind``, ``instance``, ``start``, ``end``,
``workflow`` ...; ``prefill``/``decode`` GPU names; ``workflows``; ``critical_path``), so it
needs nothing from that module. matplotlib is imported inside :func:`draw_gantt` only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Chrome trace layout: one process per instance; a decode instance's process has one thread
# track per concurrent span of each group, because "X" events on one track must not overlap
# (batched decodes, parallel transfers and queue waits do).
# Track k (1, 2, ...) of a group is thread base + k.
TRACK_GROUPS = {"transfer": (0, "kv in"), "wait": (1000, "queue"),
                "recompute": (2000, "batch"), "decode": (2000, "batch")}


def pack_tracks(spans: Sequence[Any]) -> list[int]:
    """A track number (1, 2, ...) per span such that spans of one decode instance and track
    group never overlap on a track (first fit in start order; prefill spans get 1: a prefill
    instance runs one call at a time)."""
    out = [1] * len(spans)
    ends: dict[tuple[int, int], list[float]] = {}
    for i in sorted(range(len(spans)), key=lambda i: (spans[i].start, i)):
        s = spans[i]
        if s.kind == "prefill":
            continue
        free = ends.setdefault((s.instance, TRACK_GROUPS[s.kind][0]), [])
        for k, end in enumerate(free):
            if end <= s.start:
                free[k] = s.end
                out[i] = k + 1
                break
        else:
            free.append(s.end)
            out[i] = len(free)
    return out


# -- the Gantt (matplotlib, imported inside draw_gantt only) ------------------------------------
_STRONG = {"prefill": "#2f6fb0", "decode": "#e07b24", "recompute": "#7b4fb5",
           "transfer": "#2a9d4b", "wait": "#9a9a9a"}
_FAINT = {"prefill": "#c9d8ec", "decode": "#f6dcc4", "recompute": "#ddd0ee"}
_PATH = "#d62728"  # the critical path's outline and links


def draw_gantt(tl: Any, path: Path, w: int, window: tuple[float, float]) -> None:
    """Draw ``tl`` into ``path`` (see :meth:`Timeline.save_gantt`). Uses matplotlib's object API
    with the Agg canvas, so it neither needs a display nor changes pyplot's global backend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    t0, t1 = window
    P, D = len(tl.prefill), len(tl.decode)
    info = tl.workflows[w]
    crit = tl.critical_path(w)
    on_path = set(crit)
    shown = [s for s in tl.spans if s.end >= t0 and s.start <= t1]
    mine = [s for s in shown if s.workflow == w]
    rows = P + D

    def row(s: Any) -> int:
        return s.instance if s.kind == "prefill" else P + s.instance

    fig = Figure(figsize=(13, max(4.5, 0.5 * rows + 2.6)), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    # other workflows: faint; a decode row is split into as many sub-rows as calls ran at once
    # in the window, so the picture shows how full each batch was
    others = [s for s in shown if s.workflow != w and s.kind in _FAINT]
    tracks = pack_tracks(others)
    depth: dict[int, int] = {}
    for s, k in zip(others, tracks, strict=True):
        if s.kind != "prefill":
            depth[s.instance] = max(depth.get(s.instance, 0), k)
    for s, k in zip(others, tracks, strict=True):
        y = row(s)
        if s.kind == "prefill":
            ax.broken_barh([(s.start, s.duration)], (y - 0.4, 0.8), color=_FAINT["prefill"],
                           edgecolor="white", linewidth=0.4)
        else:
            h = 0.8 / depth[s.instance]
            ax.broken_barh([(s.start, s.duration)], (y - 0.4 + (k - 1) * h, 0.9 * h),
                           color=_FAINT[s.kind], linewidth=0)
    # the highlighted workflow: strong colours on top, its critical path outlined
    first = {}  # call -> its prefill span (the wait for prefill ends where it starts)
    for s in mine:
        if s.kind == "prefill":
            for c in (s.call, *s.riders):
                first[c] = s
    width = t1 - t0
    for c in info.calls:
        s = first.get(c.index)
        if s is not None and s.call == c.index and s.start > c.reveal:
            ax.broken_barh([(c.reveal, s.start - c.reveal)], (row(s) - 0.22, 0.44),
                           facecolor="white", edgecolor=_STRONG["wait"], hatch="////",
                           linewidth=0.6, zorder=3)
    # its decode-side spans share sub-rows of a band when they overlap (a sample group's
    # members decode side by side); the band leaves the row's edges free, so the other
    # workflows' calls batched with them stay visible above and below
    sub = dict(zip(map(id, mine), pack_tracks(mine), strict=True))
    lanes: dict[int, int] = {}
    for s in mine:
        if s.kind != "prefill" and s.kind != "transfer":
            lanes[s.instance] = max(lanes.get(s.instance, 0), sub[id(s)])
    for s in mine:
        crit_span = any(s.serves(c) for c in on_path)
        edge = {"edgecolor": _PATH, "linewidth": 2.0} if crit_span else {
            "edgecolor": "black", "linewidth": 0.6}
        if s.kind == "transfer":
            ax.annotate("", xy=(s.end, P + s.instance), xytext=(s.start, s.source),
                        arrowprops={"arrowstyle": "-|>", "color": _STRONG["transfer"],
                                    "lw": 1.4, "shrinkA": 0, "shrinkB": 0}, zorder=5)
            continue
        if s.kind == "prefill":
            y0, h = row(s) - 0.36, 0.72
        else:
            h = 0.56 / lanes[s.instance]
            y0 = row(s) - 0.28 + (sub[id(s)] - 1) * h
        if s.kind == "wait":
            ax.broken_barh([(s.start, s.duration)], (y0, h), facecolor="white", hatch="////",
                           zorder=3, **{**edge, "edgecolor": edge["edgecolor"] if crit_span
                                        else _STRONG["wait"]})
            continue
        ax.broken_barh([(s.start, s.duration)], (y0, h), facecolor=_STRONG[s.kind], zorder=4,
                       **edge)
        if s.duration > 0.03 * width and h >= 0.25:
            text = f"c{s.call}"
            if s.kind == "prefill" and s.duration > 0.055 * width:  # why it took this long
                text += f" · {s.tokens / 1000:.1f}k tok\n{s.cached / s.tokens:.0%} cached"
            ax.text(s.start + s.duration / 2, y0 + h / 2, text, ha="center", va="center",
                    fontsize=7, color="white", fontweight="bold", zorder=6, clip_on=True)
    # the critical path's hand-offs: parent finish -> child's reveal (tool latency) and queue
    calls = info.calls
    for a, b in zip(crit, crit[1:], strict=False):
        parent, child = calls[a], calls[b]
        ps = first.get(b)
        if ps is None:
            continue
        ax.plot([parent.finish, child.reveal], [P + parent.decode_instance, row(ps)],
                color=_PATH, linestyle=":", linewidth=1.6, zorder=5)
    # the workflow's arrival, finish, and where it would have finished alone
    marks = [(info.arrival, "a_w (arrival)", "-"), (info.finish, "C_w (finish)", "-")]
    if info.horizon > 0:
        marks.append((info.arrival + info.horizon, "a_w + H_w (alone)", "--"))
    last, level = -math.inf, 0
    for x, label, style in sorted(marks):
        if t0 <= x <= t1:
            ax.axvline(x, color="black", linestyle=style, linewidth=0.9, zorder=2)
            level = level + 1 if x - last < 0.12 * width else 0  # stagger labels that meet
            last = x
            ax.text(x, -0.55 - 0.4 * (level % 2), f" {label}", ha="left", va="center",
                    fontsize=8, bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5})
    ax.axhline(P - 0.5, color="black", linewidth=0.8)
    ax.set_yticks(range(rows))
    ax.set_yticklabels([tl.lane_name("prefill", p) for p in range(P)]
                       + [tl.lane_name("decode", d) for d in range(D)], fontsize=8)
    ax.set_ylim(rows - 0.5, -1.1)
    ax.set_xlim(t0, t1)
    ax.set_xlabel("simulated time (s)")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    where = " / ".join(x for x in (tl.meta.get("cluster"), tl.meta.get("trace")) if x)
    who = " on ".join(x for x in (tl.meta.get("policy"), where) if x) or "episode"
    path_text = " → ".join(f"c{c}" for c in crit)
    ax.set_title(f"{who}: workflow w{w} ({info.workflow_id}), {len(calls)} "
                 f"call{'s' if len(calls) != 1 else ''}, "
                 f"C_w/H_w = {info.ratio:.2f}\ncritical path {path_text}", fontsize=10)
    handles = [
        Patch(color=_STRONG["prefill"], label="prefill"),
        Patch(color=_STRONG["decode"], label="decode"),
        Patch(color=_STRONG["recompute"], label="recompute (after preemption)"),
        Patch(facecolor="white", edgecolor=_STRONG["wait"], hatch="////",
              label="waiting (prefill / decode queue)"),
        Line2D([], [], color=_STRONG["transfer"], marker=">", label="KV transfer P → D"),
        Patch(facecolor="white", edgecolor=_PATH, linewidth=2, label="critical path"),
        Line2D([], [], color=_PATH, linestyle=":", label="parent finish → child reveal"),
        Patch(color=_FAINT["decode"], label="other workflows (decode rows: one sub-row per "
              "concurrent call)"),
    ]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=4,
              fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path)
