"""Timelines of a simulated episode: what ran on which instance, when (docs/timelines.md).

An engine built with ``record_timeline=True`` appends one raw tuple per interval as its events
happen, and :func:`build_timeline` turns them into a :class:`Timeline` when the episode's result
is read (``EpisodeResult.timeline``). A timeline holds:

- ``prefill`` spans on prefill instances (one call at a time per instance);
- ``transfer`` spans of a call's KV from its prefill instance to its decode instance (a free
  decode call moved to another instance has a second one);
- ``wait`` spans in a decode instance's queue (after a transfer or a preemption);
- ``recompute`` spans of a preempted call rebuilding its KV on its decode instance;
- ``decode`` spans (a preempted call has one per interval it decoded).

Times are simulated seconds. The Chrome trace (:meth:`Timeline.to_chrome_trace`) opens in
Perfetto (https://ui.perfetto.dev) and ``chrome://tracing``; :meth:`Timeline.save_gantt` draws a
PNG with matplotlib, imported only inside it (the core does not need it otherwise).
"""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Iterable, Sequence
from numbers import Integral
from operator import itemgetter
from pathlib import Path
from typing import Any, NamedTuple

KINDS = ("prefill", "transfer", "wait", "recompute", "decode")
"""Span kinds. A ``prefill`` span's instance is a prefill instance; every other kind's is a
decode instance (a transfer's destination; ``Span.source`` is its prefill instance)."""

# Chrome trace layout: one process per instance; a decode instance's process has one thread
# track per concurrent span of each group, because "X" events on one track must not overlap
# (batched decodes, parallel transfers and queue waits do).
# Track k (1, 2, ...) of a group is thread base + k.
_TRACK_GROUPS = {"transfer": (0, "kv in"), "wait": (1000, "queue"),
                 "recompute": (2000, "batch"), "decode": (2000, "batch")}


class Span(NamedTuple):
    """One interval of one call on one instance (simulated seconds, ``start <= end``).

    A named tuple: an episode has a few spans per call, and tuples are built several times
    faster than dataclass instances (the build is part of a recorded rollout's cost).

    Attributes:
        kind: one of :data:`KINDS`.
        instance: the prefill instance of a ``prefill`` span; the decode instance otherwise (a
            transfer's destination).
        gpu: the instance's GPU name.
        workflow: the workflow's index in the episode (arrival order; unique even when an
            episode samples a trace's workflow twice).
        workflow_id: the workflow's id in its trace.
        call: the call's index in its workflow.
        start, end: when the interval began and ended.
        tokens: prefill: prompt tokens; transfer: prompt tokens sent; recompute: tokens whose KV
            is rebuilt (prompt and generated); decode: tokens generated in this interval; wait: 0.
        cached: prefill: prompt tokens served from the prefix cache (0 otherwise).
        source: transfer: the prefill instance the KV comes from (-1 otherwise).
        riders: call indices of a sample group's other members that this span serves too (their
            shared prefill, transfer and queue wait; each member has its own decode span).
    """

    kind: str
    instance: int
    gpu: str
    workflow: int
    workflow_id: str
    call: int
    start: float
    end: float
    tokens: int = 0
    cached: int = 0
    source: int = -1
    riders: tuple[int, ...] = ()

    @property
    def lane(self) -> str:
        """``"prefill"`` or ``"decode"``: the pool of the instance the span runs on."""
        return "prefill" if self.kind == "prefill" else "decode"

    @property
    def duration(self) -> float:
        return self.end - self.start

    def serves(self, call: int) -> bool:
        """Whether this span is (also) the interval of call ``call`` of its workflow."""
        return call == self.call or call in self.riders


class CallInfo(NamedTuple):
    """What a timeline keeps of one call besides its spans."""

    index: int
    parents: tuple[int, ...]
    reveal: float  # when it became visible to the scheduler (its wait for prefill began)
    finish: float
    prefill_instance: int
    decode_instance: int  # where it finished


class WorkflowInfo(NamedTuple):
    """What a timeline keeps of one workflow: arrival a_w, finish C_w, horizon H_w, ratio."""

    index: int
    workflow_id: str
    arrival: float
    finish: float
    horizon: float
    ratio: float
    calls: tuple[CallInfo, ...]


class Timeline:
    """The spans of one episode, with the instances and workflows needed to draw them.

    Attributes:
        spans: every :class:`Span`, sorted by start time (ties in recording order).
        prefill: GPU name of each prefill instance (index = instance).
        decode: GPU name of each decode instance.
        workflows: a :class:`WorkflowInfo` per workflow, in episode (arrival) order.
        meta: descriptive strings (``cluster``, ``policy``) shown in the trace and the Gantt.
    """

    def __init__(self, spans: Sequence[Span], prefill: Sequence[str], decode: Sequence[str],
                 workflows: Sequence[WorkflowInfo], meta: dict[str, str] | None = None) -> None:
        self.spans = list(spans)
        self.prefill = tuple(prefill)
        self.decode = tuple(decode)
        self.workflows = list(workflows)
        self.meta = dict(meta or {})

    def __len__(self) -> int:
        return len(self.spans)

    def __repr__(self) -> str:
        return (f"Timeline({len(self.spans)} spans, {len(self.workflows)} workflows, "
                f"{len(self.prefill)}P+{len(self.decode)}D)")

    # -- queries ----------------------------------------------------------------------------------
    def lane_name(self, lane: str, instance: int) -> str:
        """``"prefill 3 (h100)"`` / ``"decode 0 (a100)"``."""
        gpus = self.prefill if lane == "prefill" else self.decode
        return f"{lane} {instance} ({gpus[instance]})"

    def workflow_index(self, workflow: int | str) -> int:
        """The episode index of ``workflow``: an index, or a trace workflow id (its first
        occurrence in the episode).

        Raises:
            ValueError: no such workflow in this episode.
        """
        if isinstance(workflow, Integral) and not isinstance(workflow, bool):  # numpy ints too
            workflow = int(workflow)
            if not 0 <= workflow < len(self.workflows):
                raise ValueError(f"workflow index {workflow} is out of range: the episode has "
                                 f"{len(self.workflows)} workflows (0..{len(self.workflows) - 1})")
            return workflow
        for w in self.workflows:
            if w.workflow_id == workflow:
                return w.index
        raise ValueError(f"no workflow with id {workflow!r} in this episode (ids look like "
                         f"{self.workflows[0].workflow_id!r})" if self.workflows else
                         f"no workflow with id {workflow!r}: the episode is empty")

    def worst_workflow(self) -> int:
        """Episode index of the workflow with the largest ratio C_w/H_w (the first on ties)."""
        if not self.workflows:
            raise ValueError("the episode has no workflows")
        return max(self.workflows, key=lambda w: (w.ratio, -w.index)).index

    def workflow_spans(self, workflow: int | str) -> list[Span]:
        """Every span of one workflow (index or id), by start time."""
        i = self.workflow_index(workflow)
        return [s for s in self.spans if s.workflow == i]

    def call_spans(self, workflow: int | str, call: int) -> list[Span]:
        """Every span of one call, by start time (for a sample-group member, the group's shared
        prefill, transfer and wait spans too)."""
        return [s for s in self.workflow_spans(workflow) if s.serves(call)]

    def critical_path(self, workflow: int | str) -> list[int]:
        """The chain of calls that set the workflow's finish time, first call first: from the
        last call to finish, walk back through the parent that finished last (earliest index
        on ties)."""
        w = self.workflows[self.workflow_index(workflow)]
        if not w.calls:
            return []
        calls = w.calls
        c = max(calls, key=lambda x: (x.finish, -x.index))
        path = [c.index]
        while c.parents:
            c = max((calls[p] for p in c.parents), key=lambda x: (x.finish, -x.index))
            path.append(c.index)
        return path[::-1]

    # -- Chrome / Perfetto trace ----------------------------------------------------------------
    def to_chrome_trace(self) -> dict[str, Any]:
        """The timeline as a Chrome trace-event JSON object (docs/timelines.md).

        One process per instance (prefill instances first), named ``"prefill 3 (h100)"``; a
        prefill process has one track, a decode process has tracks ``kv in k`` (transfers
        arriving there), ``queue k`` (waits) and ``batch k`` (decode and recompute), as many of
        each as spans overlap. Spans are complete events (``"ph": "X"``) named after their
        workflow (so a workflow keeps one colour), with their kind as category and ``ts``/``dur``
        in microseconds of simulated time; ``args`` carry workflow, call and tokens.
        """
        P = len(self.prefill)
        events: list[dict[str, Any]] = []
        names: set[tuple[int, int]] = set()

        def meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> None:
            events.append({"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args})

        for p in range(P):
            meta("process_name", p + 1, 0, {"name": self.lane_name("prefill", p)})
            meta("process_sort_index", p + 1, 0, {"sort_index": p})
            meta("thread_name", p + 1, 1, {"name": "prefill"})
        for d in range(len(self.decode)):
            meta("process_name", P + d + 1, 0, {"name": self.lane_name("decode", d)})
            meta("process_sort_index", P + d + 1, 0, {"sort_index": P + d})
        tracks = _pack_tracks(self.spans)
        for s, track in zip(self.spans, tracks, strict=True):
            if s.kind == "prefill":
                pid, tid = s.instance + 1, 1
            else:
                base, label = _TRACK_GROUPS[s.kind]
                pid, tid = P + s.instance + 1, base + track
                if (pid, tid) not in names:
                    names.add((pid, tid))
                    meta("thread_name", pid, tid, {"name": f"{label} {track}"})
                    meta("thread_sort_index", pid, tid, {"sort_index": tid})
            args: dict[str, Any] = {"kind": s.kind, "workflow": s.workflow,
                                    "workflow_id": s.workflow_id, "call": s.call,
                                    "tokens": s.tokens}
            if s.kind == "prefill":
                args["cached_tokens"] = s.cached
            elif s.kind == "transfer":
                args["from"] = self.lane_name("prefill", s.source)
                args["to"] = self.lane_name("decode", s.instance)
            if s.riders:
                args["riders"] = list(s.riders)
            events.append({"name": f"w{s.workflow} {s.workflow_id}", "cat": s.kind, "ph": "X",
                           "ts": round(s.start * 1e6, 3),
                           "dur": round((s.end - s.start) * 1e6, 3),
                           "pid": pid, "tid": tid, "args": args})
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"clock": "simulated time (ts, dur in microseconds)", **self.meta}}

    def save_chrome_trace(self, path: str | Path) -> Path:
        """Write :meth:`to_chrome_trace` as JSON to ``path`` (parents created); returns it."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as f:
            json.dump(self.to_chrome_trace(), f, separators=(",", ":"))
        return path

    # -- Gantt ----------------------------------------------------------------------------------
    def save_gantt(self, path: str | Path, workflow: int | str | None = None,
                   window: tuple[float, float] | None = None) -> Path:
        """Draw a PNG Gantt chart: one row per instance, spans coloured by kind, one workflow
        highlighted with its critical path outlined.

        Args:
            path: the PNG to write (parents created).
            workflow: the highlighted workflow (episode index or trace id); None: the one with
                the worst ratio C_w/H_w.
            window: (start, end) simulated seconds shown; None: the workflow's lifetime with a
                margin of 15 % of it on each side.

        Raises:
            ValueError: an unknown workflow, or a window whose end is not after its start.
        """
        w = self.worst_workflow() if workflow is None else self.workflow_index(workflow)
        info = self.workflows[w]
        if window is None:
            life = max(info.finish - info.arrival, 1e-3)
            window = (max(0.0, info.arrival - 0.15 * life), info.finish + 0.15 * life)
        t0, t1 = (float(x) for x in window)
        if not (math.isfinite(t0) and math.isfinite(t1) and t1 > t0):
            raise ValueError(f"window must be (start, end) seconds with end > start, got "
                             f"{window!r}")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        _draw_gantt(self, path, w, (t0, t1))
        return path


def _pack_tracks(spans: Sequence[Span]) -> list[int]:
    """A track number (1, 2, ...) per span such that spans of one decode instance and track
    group never overlap on a track (first fit in start order; prefill spans get 1: a prefill
    instance runs one call at a time)."""
    out = [1] * len(spans)
    ends: dict[tuple[int, int], list[float]] = {}
    for i in sorted(range(len(spans)), key=lambda i: (spans[i].start, i)):
        s = spans[i]
        if s.kind == "prefill":
            continue
        free = ends.setdefault((s.instance, _TRACK_GROUPS[s.kind][0]), [])
        for k, end in enumerate(free):
            if end <= s.start:
                free[k] = s.end
                out[i] = k + 1
                break
        else:
            free.append(s.end)
            out[i] = len(free)
    return out


def build_timeline(raw: Iterable[tuple], prefill: Sequence[Any], decode: Sequence[Any],
                   workflows: Sequence[Any], ratios: Sequence[float],
                   meta: dict[str, str] | None = None) -> Timeline:
    """The :class:`Timeline` of an engine's recording (``Engine.result`` calls this).

    Args:
        raw: ``(kind, instance, start, end, uid, tokens, extra)`` tuples as recorded, where
            ``uid`` is the engine's call uid and ``extra`` the cached tokens of a prefill or
            the source prefill instance of a transfer. (The engine records uids, not call
            objects, so the tuples hold only numbers and strings: the cyclic GC stops tracking
            them, and a long recording does not make its full collections come sooner.)
        prefill, decode: the engine's instances (``gpu`` attribute).
        workflows: the engine's finished workflows, in episode order.
        ratios: C_w/H_w per workflow, in the same order.
        meta: descriptive strings (cluster, policy).
    """
    # the build allocates a few acyclic tuples per call: a cyclic collection triggered midway
    # would walk the whole episode's heap for nothing (it doubled the build's time)
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _build(raw, [inst.gpu for inst in prefill], [inst.gpu for inst in decode],
                      workflows, ratios, meta)
    finally:
        if collecting:
            gc.enable()


def _build(raw: Iterable[tuple], pre: list[str], dec: list[str], workflows: Sequence[Any],
           ratios: Sequence[float], meta: dict[str, str] | None) -> Timeline:
    new = tuple.__new__  # Span's own __new__ is a Python function: 3x slower per span
    calls = {c.uid: c for wf in workflows for c in wf.calls}
    spans = []
    append = spans.append
    for kind, inst, start, end, uid, tokens, extra in raw:
        call = calls[uid]
        wf = call.workflow
        riders = tuple(call.spec.riders) if call.width > 1 and kind != "decode" else ()
        if kind == "prefill":
            append(new(Span, (kind, inst, pre[inst], wf.uid, wf.spec.workflow_id, call.index,
                              start, end, tokens, extra, -1, riders)))
        else:
            append(new(Span, (kind, inst, dec[inst], wf.uid, wf.spec.workflow_id, call.index,
                              start, end, round(tokens), 0, extra, riders)))
    spans.sort(key=itemgetter(6))  # by start; the sort is stable
    infos = [WorkflowInfo(wf.uid, wf.spec.workflow_id, wf.arrival, wf.finish_t, wf.horizon,
                          float(r),
                          tuple(CallInfo(c.index, tuple(c.spec.parents), c.reveal_t, c.finish_t,
                                         c.prefill_inst, c.decode_inst) for c in wf.calls))
             for wf, r in zip(workflows, ratios, strict=True)]
    return Timeline(spans, pre, dec, infos, meta)


# -- the Gantt (matplotlib, imported inside _draw_gantt only) -----------------------------------
_STRONG = {"prefill": "#2f6fb0", "decode": "#e07b24", "recompute": "#7b4fb5",
           "transfer": "#2a9d4b", "wait": "#9a9a9a"}
_FAINT = {"prefill": "#c9d8ec", "decode": "#f6dcc4", "recompute": "#ddd0ee"}
_PATH = "#d62728"  # the critical path's outline and links


def _draw_gantt(tl: Timeline, path: Path, w: int, window: tuple[float, float]) -> None:
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

    def row(s: Span) -> int:
        return s.instance if s.kind == "prefill" else P + s.instance

    fig = Figure(figsize=(13, max(4.5, 0.5 * rows + 2.6)), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    # other workflows: faint; a decode row is split into as many sub-rows as calls ran at once
    # in the window, so the picture shows how full each batch was
    others = [s for s in shown if s.workflow != w and s.kind in _FAINT]
    tracks = _pack_tracks(others)
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
    sub = dict(zip(map(id, mine), _pack_tracks(mine), strict=True))
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
