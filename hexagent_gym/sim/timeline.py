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
PNG with matplotlib, imported only inside it (the core does not need it otherwise); the layout
and drawing live in :mod:`hexagent_gym.sim.timeline_draw`.
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

from hexagent_gym.sim.timeline_draw import TRACK_GROUPS, draw_gantt, pack_tracks

KINDS = ("prefill", "transfer", "wait", "recompute", "decode")
"""Span kinds. A ``prefill`` span's instance is a prefill instance; every other kind's is a
decode instance (a transfer's destination; ``Span.source`` is its prefill instance)."""



def _micros(ns: int) -> float:
    """Integer nanoseconds as microseconds: the float nearest ``ns / 1000`` (one correctly
    rounded division), which JSON writes as that exact 3-decimal number (the shortest repr;
    exact while the number has at most 15 significant digits, i.e. below about 10^6 simulated
    seconds)."""
    return ns / 1000


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

        ``ts`` and ``dur`` are whole nanoseconds written as microseconds (3 decimals): each span's
        start and end are rounded to integer nanoseconds first and ``dur`` is their difference,
        so ``ts + dur`` is exactly the rounded end (in decimal, as written). Spans that touch in
        simulated time touch exactly in the trace, and spans that do not overlap in simulated
        time never overlap on a track (rounding is monotonic).
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
        tracks = pack_tracks(self.spans)
        for s, track in zip(self.spans, tracks, strict=True):
            if s.kind == "prefill":
                pid, tid = s.instance + 1, 1
            else:
                base, label = TRACK_GROUPS[s.kind]
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
            # rounding ts and dur separately could put ts + dur 1 ns past the next span's ts
            start_ns, end_ns = round(s.start * 1e9), round(s.end * 1e9)
            events.append({"name": f"w{s.workflow} {s.workflow_id}", "cat": s.kind, "ph": "X",
                           "ts": _micros(start_ns), "dur": _micros(end_ns - start_ns),
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
        draw_gantt(self, path, w, (t0, t1))
        return path


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
