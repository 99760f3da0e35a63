"""Exact copies of a running simulator: the seam for search policies and what-if questions.

A fork is a deep copy of the episode's mutable state (clock, event heap, instances, queues,
live calls and workflows, prefix caches, the open decision point and its Ŝ, counters, random
generators) that shares everything the episode never mutates (cluster, tables, workload and call
specs, latency models, the length predictor, the standalone-horizon cache, the drawn estimation
errors and predictions) and, through :class:`ForkShare`, the workflows that have finished and
their calls, which nothing touches again: a fork then costs the live state, not the episode's
history (docs/overload.md). Continued with the same picks, a fork produces exactly the original's
events and results (tested), and nothing done to a fork reaches the original.

:func:`known_only` cuts a fork down to what a scheduler could know (no future arrivals,
predicted output lengths), for search policies that must stay implementable;
:func:`revealed_only` cuts it further, to the calls already revealed.

Wall-clock fields (``scheduler_seconds``, ``wall_seconds``, invocation times) are copied as they
are and then keep counting in each copy separately; with ``planning_latency="measured"`` the
plan landing times depend on wall time, so such runs are not reproducible to begin with.
"""

from __future__ import annotations

import copy
import heapq
import itertools
import re
from typing import TYPE_CHECKING, Any

from hexagent_gym.planning.entities import CallState
from hexagent_gym.sim.events import Phase
from hexagent_gym.workload.arrivals import EpisodeWorkload

if TYPE_CHECKING:
    from hexagent_gym.planning.decisions import DecisionPoint
    from hexagent_gym.sim.engine import Engine

_COUNT = re.compile(r"count\((-?\d+)\)")
# calls whose output length known_only replaces by its prediction: not decoding yet
_NOT_DECODING = (CallState.HIDDEN, CallState.WAITING_PREFILL, CallState.PREFILL,
                 CallState.TRANSFER, CallState.WAITING_DECODE)


def shared_objects(sim: Engine) -> dict[int, Any]:
    """The deepcopy memo of what every fork of ``sim`` shares with it (read-only state).

    It stays valid for the episode because these objects are never replaced or mutated after
    construction; :class:`ForkShare` holds it for :func:`fork`.
    """
    keep: list[Any] = [sim.cluster, sim.tables, sim.workload, sim.horizons, sim.predictor,
                       getattr(sim, "_err", None), getattr(sim, "_pred", None),
                       getattr(sim, "_call_offset", None)]
    keep += [inst.latency for inst in sim.prefill]
    keep += [inst.latency for inst in sim.decode]
    for spec in sim.workload.workflows:
        keep.append(spec)
        keep.extend(spec.calls)
    return {id(obj): obj for obj in keep if obj is not None}


class ForkShare:
    """The memo of what forks of one episode share with it, kept current as workflows finish.

    :func:`shared_objects` at construction, plus every workflow in ``sim.finished`` and its
    calls, added as they finish (each once: :meth:`memo` reads only the finish list's new tail).
    A finished workflow is never written again (its calls are done; the cuts of
    :func:`known_only` and :func:`revealed_only` skip it), so sharing it keeps forks exact, and
    the finish list keeps it alive, so its ``id`` stays its own. Valid for the episode of
    ``sim`` only.
    """

    __slots__ = ("sim", "_memo", "_seen")

    def __init__(self, sim: Engine) -> None:
        self.sim = sim
        self._memo = shared_objects(sim)
        self._seen = 0

    def memo(self) -> dict[int, Any]:
        """The shared memo now (the live dict: copy it before handing it to ``deepcopy``)."""
        finished = self.sim.finished
        if self._seen < len(finished):
            memo = self._memo
            for wf in finished[self._seen:]:
                memo[id(wf)] = wf
                for c in wf.calls:
                    memo[id(c)] = c
            self._seen = len(finished)
        return self._memo


def _counter_copies(sim: Engine) -> dict[int, Any]:
    """Fresh ``itertools.count`` objects at each counter's next value: read from the repr so the
    original's counters are not advanced (and deepcopy support of itertools is not relied on)."""
    out = {}
    for value in [*vars(sim).values(), sim.events._seq]:
        if isinstance(value, itertools.count):
            m = _COUNT.fullmatch(repr(value))
            if m is None:  # a count with a step: never built by the engine
                raise TypeError(f"cannot fork a simulator holding {value!r}")
            out[id(value)] = itertools.count(int(m.group(1)))
    return out


def fork(sim: Engine, *bound: Any, shared: ForkShare | None = None) -> tuple[Any, ...]:
    """Copy ``sim`` and the objects ``bound`` to it, keeping their references to each other.

    Args:
        sim: the simulator (between events; a decision point may be open, with picks made).
        bound: objects holding references into the episode that must follow the copy, e.g. a
            policy with per-decision state (its reference to the open decision point then points
            at the copy's).
        shared: a :class:`ForkShare` of ``sim`` (a search forking many times keeps one for the
            episode), or None (built here).

    Returns:
        ``(sim_copy, *bound_copies)``; :func:`pending_decision` of the copy is the copy of the
        open decision point (None if none is open).
    """
    if shared is None:
        shared = ForkShare(sim)
    elif shared.sim is not sim:
        raise ValueError("shared is the ForkShare of another simulator")
    memo = dict(shared.memo())
    memo.update(_counter_copies(sim))
    # lists that only grow and hold only shared or immutable items: copied flat, not walked
    memo[id(sim.finished)] = list(sim.finished)
    memo[id(sim.invocation_seconds)] = list(sim.invocation_seconds)
    return copy.deepcopy((sim, *bound), memo)


def pending_decision(sim: Engine) -> DecisionPoint | None:
    """The decision point ``sim`` has open (returned by its last ``run_until_decision``), or
    None; on a fork, the copy of the original's open decision with its picks so far."""
    return sim._pending


def cut_arrivals(sim: Engine, keep: int) -> None:
    """End a fork's workload after its first ``keep`` workflows (in place): later ones never
    arrive. ``keep`` below the number arrived is an error; at or above the workload's length
    nothing changes. :func:`known_only` keeps the arrived ones; the oracle search keeps a window
    of the true future (``hexagent_gym.agents.search``). Never apply it to the episode being
    scored."""
    arrived = len(sim.workflows)
    if keep < arrived:
        raise ValueError(f"cannot cut the workload to {keep} workflows: {arrived} have arrived")
    w = sim.workload
    if keep >= len(w.workflows):
        return
    sim.workload = EpisodeWorkload(w.workflows[:keep], w.arrivals[:keep], w.trace_indices[:keep])
    heap = sim.events.heap
    # arrivals are pushed one at a time (the next one only): drop it if it is cut off
    kept = [e for e in heap if e[1] != Phase.ARRIVAL or e[3] < keep]
    if len(kept) != len(heap):
        heap[:] = kept
        heapq.heapify(heap)
    sim._next_arrival = min(sim._next_arrival, keep)


def known_only(sim: Engine) -> None:
    """Cut a fork down to what its scheduler knows (in place): no workflow arrives after now, and
    every call not decoding yet has its predicted output length as its true one (KV demand
    adjusted). For implementable search policies (``hexagent_gym.agents.search``); never apply it
    to the episode being scored.

    Sample-group leaders keep their group's true demand (a group's KV is the sum over its
    members; the predictor gives the leader's own length only).
    """
    cut_arrivals(sim, len(sim.workflows))
    if getattr(sim, "_faults", None) is not None:  # faults under way and their ends, no new one
        sim._faults.forget_future()
    for wf in sim.workflows:
        if wf.finish_t >= 0.0:  # done, and shared with the original (ForkShare): not ours
            continue
        for c in wf.calls:
            if (c.state in _NOT_DECODING and c.generated == 0 and c.width == 1
                    and c.lead is None and c.l_out != c.l_out_pred):
                c.kv_true += c.l_out_pred - c.l_out
                c.l_out = c.l_out_pred


def revealed_only(sim: Engine) -> None:
    """:func:`known_only`, and further: every arrived workflow ends with its calls revealed so
    far (in place). Calls not yet revealed, including those whose reveal is already on the clock
    (a tool running), never appear, so a workflow finishes when its last revealed call does; a
    workflow with none left open finishes at once, at its latest call's finish. This is all a
    scheduler that knows no workflow template sees (HexAgent's own view: its running horizon
    H_w(t) covers the revealed subgraph only). Never apply it to the episode being scored.
    """
    known_only(sim)
    heap = sim.events.heap
    kept = [e for e in heap if e[1] != Phase.REVEAL]
    if len(kept) != len(heap):
        heap[:] = kept
        heapq.heapify(heap)
    for wf in sim.workflows:
        if wf.finish_t >= 0.0:
            continue
        hidden = [c for c in wf.calls if c.state == CallState.HIDDEN]
        if not hidden:
            continue
        for c in hidden:
            c.pending_parents = -1  # a parent's completion never brings it to 0: never revealed
        wf.num_done += len(hidden)
        if wf.num_done == len(wf.calls):  # nothing revealed is open: its known part is done
            wf.finish_t = max(c.finish_t for c in wf.calls)
            sim._done_workflows += 1
            sim.finished.append(wf)


__all__ = ["ForkShare", "cut_arrivals", "fork", "known_only", "pending_decision", "revealed_only",
           "shared_objects"]
