"""Runtime entities of one episode: calls, workflows, prefill and decode instances.

Plain slotted classes with public fields: the event loop touches them millions of times, so there
are no properties or validation layers on the hot path; invariants are asserted on transitions.
"""

from __future__ import annotations

import copy
import heapq
import math
from enum import IntEnum
from typing import TYPE_CHECKING

from hexagent_gym.planning import kernels
from hexagent_gym.planning.prefill_queue import PrefillQueue

if TYPE_CHECKING:
    from collections.abc import Sequence

    from hexagent_gym.cluster.latency import LatencyModel
    from hexagent_gym.workload.workload import CallSpec, WorkflowSpec


class CallState(IntEnum):
    """Lifecycle of a call (docs/simulator.md). Transitions move forward, except a decode
    preemption (DECODE → WAITING_DECODE) and a free call's move (WAITING_DECODE → TRANSFER)."""

    HIDDEN = 0
    WAITING_PREFILL = 1
    PREFILL = 2
    TRANSFER = 3
    WAITING_DECODE = 4
    DECODE = 5
    DONE = 6


# Queue keys: preempted calls first (back at the front of their decode queue), then planned
# calls, then unplanned ones; within each group by preemption / rank / reveal order. A key is one
# int, the group's base plus the order within it (below 2**40: counters of one episode), so it
# orders as the pair (group, order) would: an int is not tracked by the garbage collector and
# compares faster than a tuple, and every call holds one key to its episode's end.
_GROUP = 1 << 40
PREEMPTED = -_GROUP
PLANNED = 0
UNPLANNED = _GROUP


class Call:
    """One LLM call at run time: true lengths drive service; ``*_est``/``*_pred`` are estimates."""

    __slots__ = (
        "uid", "workflow", "index", "spec", "l_in", "l_out", "l_out_pred", "kv_true", "kv_pred",
        "pf_err", "dec_err", "state", "reveal_t", "reveal_seq", "pf_true", "pf_est", "pf_cls",
        "prefill_inst", "decode_inst", "queue_key", "pending_parents", "prefill_start",
        "prefill_end", "transfer_end", "decode_start", "finish_t", "v_admit", "v_finish",
        "v_finish_pred", "ef_start", "ef", "est_duration", "service", "proj_release",
        "pf_cold", "pf_run", "pf_queued", "cached", "hit", "held", "lead", "width",
        "group_left", "kv_free", "kv_res", "generated", "preempted", "moved", "decode_wait",
        "wait_since", "kv_blocked", "admit_seq", "ctx_term", "true_term", "view_levels",
        "ctx_share", "dec_weight", "own_ctx", "kv_demand",
    )

    def __init__(self, uid: int, workflow: Workflow, index: int, spec: CallSpec,
                 l_out_pred: int, pf_err: float, dec_err: float) -> None:
        self.uid = uid
        self.workflow = workflow
        self.index = index
        self.spec = spec
        self.l_in = spec.input_tokens
        self.l_out = spec.output_tokens
        self.l_out_pred = l_out_pred
        self.kv_true = spec.input_tokens + spec.output_tokens  # decode admission demand
        self.kv_pred = spec.input_tokens + l_out_pred
        # what it adds to its decode instance's scheduled context Σ(L_in + L̂_out/2): the one
        # place this sum's term is written (reservations, releases and Ŝ read it; a plain slot,
        # not a property, as it is read several times per pick; form_group rewrites it)
        self.ctx_share = spec.input_tokens + 0.5 * l_out_pred
        # the projections' (weight, mean own context, predicted KV), set at its first projection
        # (Projections.call_constants; dec_weight None until then): fixed once the workflow
        # has arrived. Three float slots, not a tuple: a tuple per call would be tracked by the
        # garbage collector and bring every collection nearer (docs/performance.md)
        self.dec_weight: float | None = None
        self.own_ctx = 0.0
        self.kv_demand = 0.0
        self.kv_res = self.kv_pred  # KV the decode instance reserves at admission (predicted)
        self.kv_free = self.kv_res  # reservation its finish returns (a group: its prompt last)
        self.pf_err = pf_err
        self.dec_err = dec_err
        self.state = CallState.HIDDEN
        self.reveal_t = -1.0
        self.reveal_seq = -1
        # Per-instance and per-class prefill seconds, set on reveal (empty until then). Each is
        # replaced, never changed in place: calls may share one (ClusterTables caches them)
        self.pf_true: Sequence[float] = ()  # true prefill seconds per prefill instance
        self.pf_est: Sequence[float] = ()  # scheduler-visible seconds per prefill instance
        self.pf_cls: Sequence[float] = ()  # the same per prefill class (ClusterTables.pf_models)
        self.prefill_inst = -1
        self.decode_inst = -1
        self.queue_key = UNPLANNED  # group base + order (the module's queue keys)
        self.pending_parents = len(spec.parents)
        self.prefill_start = -1.0
        self.prefill_end = -1.0
        self.transfer_end = -1.0
        self.decode_start = -1.0
        self.finish_t = -1.0
        self.v_admit = 0.0
        self.v_finish = 0.0
        self.v_finish_pred = 0.0
        self.ef_start = 0.0  # scheduler's isolated-schedule start offset (from workflow arrival)
        self.ef = 0.0  # scheduler's isolated-schedule finish offset
        self.est_duration = 0.0  # scheduler's standalone duration estimate (best pair, alone)
        self.service = 0.0  # ATLAS: attained service along the critical path up to this call
        self.proj_release = 0.0  # projected decode finish when placed (planner's reservation)
        self.pf_cold: Sequence[float] = ()  # scheduler-visible prefill seconds with no cache hit
        self.pf_run = 0.0  # scheduler-visible seconds of its prefill once started
        self.pf_queued = 0.0  # the estimate its prefill queue counts for it (queued_est)
        self.cached: tuple[int, ...] | None = None  # prompt tokens cached per instance (None: 0)
        # the caches' match of its prompt behind its current cached / pf_est (None: not viewed)
        self.view_levels: list[tuple[int, int]] | None = None
        self.hit = 0  # prompt tokens served from cache at its prefill
        self.held = 0  # blocks of its prompt it locks in its prefill instance's cache
        self.lead: Call | None = None  # a sample-group rider's leader (it rides its prefill)
        self.width = 1  # sequences it decodes (a group leader decodes for the whole group)
        self.group_left = 0  # a group leader's members still decoding
        self.generated = 0.0  # tokens generated before a preemption (kept across it)
        self.preempted = 0  # times it was preempted
        self.moved = False  # re-placed once on another decode instance (then locked there)
        self.decode_wait = 0.0  # seconds waiting in decode queues (every wait)
        self.wait_since = -1.0  # when its current decode wait began
        self.kv_blocked = False  # it waited while its decode instance's queue head lacked KV
        self.admit_seq = -1  # order of its latest admission on its decode instance
        self.ctx_term = 0.0  # its term of the instance's ctx_sum while decoding
        self.true_term = 0.0  # the constant part of its true KV use while decoding

    def __repr__(self) -> str:
        return (f"Call({self.workflow.spec.workflow_id}#{self.spec.id}, {self.state.name}, "
                f"in={self.l_in}, out={self.l_out})")

    def __deepcopy__(self, memo: dict) -> Call:
        # A simulator fork (hexagent_gym.sim.fork) copies thousands of calls: copy the two slots
        # that point into the episode's mutable graph, share the rest. Every other slot holds a
        # number, an enum, a tuple, the immutable spec, or a list that the engine replaces and never
        # mutates in place (pf_true, pf_est, pf_cls, pf_cold, cached) - keep it that way.
        new = Call.__new__(Call)
        memo[id(self)] = new
        for name in _CALL_SHARED_SLOTS:
            setattr(new, name, getattr(self, name))
        new.workflow = copy.deepcopy(self.workflow, memo)
        lead = self.lead
        new.lead = None if lead is None else copy.deepcopy(lead, memo)
        return new


_CALL_SHARED_SLOTS = tuple(n for n in Call.__slots__ if n not in ("workflow", "lead"))


class Workflow:
    """One workflow instance of the episode."""

    __slots__ = (
        "uid", "spec", "arrival", "calls", "num_done", "finish_t", "horizon", "h_est",
        "h_est_done", "open_calls", "service", "trace_index", "last_prefill", "last_decode",
        "h_pred", "forecast_stamp",
    )

    def __init__(self, uid: int, spec: WorkflowSpec, arrival: float, trace_index: int) -> None:
        self.uid = uid
        self.spec = spec
        self.arrival = arrival
        self.trace_index = trace_index
        self.calls: list[Call | None] = [None] * len(spec.calls)
        self.num_done = 0
        self.finish_t = -1.0
        self.horizon = 0.0  # true standalone completion time H_w (the metric's denominator)
        self.h_est = 0.0  # scheduler's running horizon H_w(t) of the revealed subgraph
        self.h_est_done = 0.0  # part of h_est fixed by finished calls
        self.h_pred = 0.0  # forecast Ĥ_w of the final horizon (horizon_predictors; 0: none)
        # the horizon tracker's key of its latest judgement of h_pred (-1: none yet); kept here
        # so that its change test, at every decision, reads the workflow and nothing else
        self.forecast_stamp = -1
        self.open_calls: list[Call] = []  # revealed, not finished (for h_est refresh)
        self.service = 0.0  # ATLAS program-level attained service
        self.last_prefill = -1  # prefill instance of its latest started prefill (locality)
        self.last_decode = -1  # decode instance of its latest admitted decode

    @property
    def done(self) -> bool:
        return self.num_done == len(self.calls)

    def refresh_h_est(self) -> None:
        h = self.h_est_done
        for c in self.open_calls:
            if c.ef > h:
                h = c.ef
        self.h_est = h


def head_index(queue: list[Call]) -> int:
    """Index of the call with the smallest ``queue_key`` (first on ties): the queue's head.

    Queues are short and re-ranked by every plan, so a scan beats keeping them sorted.
    """
    best = 0
    best_key = queue[0].queue_key
    for i in range(1, len(queue)):
        k = queue[i].queue_key
        if k < best_key:
            best, best_key = i, k
    return best


class _LoadEntry:
    """An instance's entry in one list of its cluster's :class:`SchedulerLoads` (read-only: the
    engine writes the lists)."""

    def __init__(self, field: str, doc: str) -> None:
        self.field = field
        self.__doc__ = doc

    def __get__(self, inst, owner: type | None = None):
        if inst is None:
            return self
        return getattr(inst.loads, self.field)[inst.index]


class PrefillInstance:
    """Single-server prefill: one call at a time, a local queue ordered by ``Call.queue_key``."""

    __slots__ = ("index", "gpu", "latency", "queue", "running", "loads")

    def __init__(self, index: int, gpu: str, latency: LatencyModel,
                 loads: SchedulerLoads | None = None) -> None:
        self.index = index
        self.gpu = gpu
        self.latency = latency
        self.queue = PrefillQueue()  # head by queue_key in O(log n): no scan per start
        self.running: Call | None = None
        # its scheduler-visible load lives in the cluster's lists (loads.pf_*[index])
        self.loads = loads if loads is not None else SchedulerLoads(index + 1, 0)

    run_end = _LoadEntry("pf_run_end",
                         "Scheduler-visible end of the running prefill (-inf: idle).")
    queued_est = _LoadEntry("pf_queued",
                            "Scheduler-visible seconds of prefill work queued (not running).")
    load_tokens = _LoadEntry("pf_tokens",
                             "Prompt tokens queued or running (the baselines' load signal).")

    def pop_next(self) -> Call:
        """Remove and return the queued call with the smallest key (first queued on ties)."""
        return self.queue.pop_next()


class DecodeInstance:
    """Continuous-batching decode with a piecewise-constant token rate.

    Every running sequence gains one token per step, so the instance keeps one *virtual token
    clock* ``v`` (tokens generated per sequence since the episode start). A call admitted at ``v0``
    finishes when ``v`` reaches ``v0 + L_out``. The step time is re-evaluated only when the batch
    changes, from the batch size and the batch's mean context over the remaining steps
    (``ctx = S + B·(v−1)/2`` with ``S = Σ(L_in + v_finish/2 − v_admit)``), which is exact for a
    lone call when step time is linear in context. See docs/simulator.md for the error measured
    against a per-token reference.
    """

    __slots__ = (
        "index", "gpu", "latency", "capacity", "max_batch", "used_kv", "batch", "v", "t_v",
        "step", "ctx_sum", "version", "waiting", "inbound", "loads", "true_base", "peak_kv",
        "recomputing", "hold", "admits", "queued",
    )

    def __init__(self, index: int, gpu: str, latency: LatencyModel, capacity: int,
                 max_batch: int, loads: SchedulerLoads | None = None) -> None:
        self.index = index
        self.gpu = gpu
        self.latency = latency
        self.capacity = capacity
        self.max_batch = max_batch
        self.used_kv = 0  # KV tokens reserved at admission (predicted demand) by running calls
        # true KV in use is true_base + len(batch) · v: every running sequence holds its prompt
        # (and tokens generated before a preemption) plus v − v_admit generated tokens
        self.true_base = 0.0
        self.peak_kv = 0.0  # largest true KV in use seen
        # preempted calls re-computing their KV before rejoining the batch: uid -> (ready, call)
        self.recomputing: dict[int, tuple[float, Call]] = {}
        self.hold = False  # no admissions until memory frees (set by a preemption)
        self.admits = 0
        self.batch: list[tuple[float, int, Call]] = []  # heap of (v_finish, uid, call)
        self.v = 0.0
        self.t_v = 0.0
        self.step = 0.0  # seconds per token at the current batch
        self.ctx_sum = 0.0  # S in the class docstring
        self.version = 0  # bumps on every batch change; stale DECODE_DONE events are ignored
        self.waiting: list[Call] = []  # transferred, not yet admitted (locked here)
        # Scheduler-visible commitments (calls placed here, from placement until they finish)
        # live in the cluster's lists: loads.dec_*[index]
        self.loads = loads if loads is not None else SchedulerLoads(0, index + 1)
        # placed here, not admitted yet (uid -> call): ``queued`` those whose prefill has not
        # started (a plan may still re-place them), ``inbound`` the others
        self.inbound: dict[int, Call] = {}
        self.queued: dict[int, Call] = {}

    committed_pred = _LoadEntry("dec_pred", "Predicted KV tokens of the calls committed here.")
    committed_count = _LoadEntry("dec_count",
                                 "Calls committed here (running, waiting or inbound).")
    sched_ctx = _LoadEntry("dec_ctx", "Σ (L_in + L_out_pred/2) over the calls committed here.")

    def reserve(self, call: Call) -> None:
        """Commit ``call``'s scheduler-visible demand to this instance (placement or a move)."""
        loads, i = self.loads, self.index
        loads.dec_pred[i] += call.kv_pred
        loads.dec_count[i] += 1
        loads.dec_ctx[i] += call.ctx_share

    def release(self, call: Call) -> None:
        """Return what :meth:`reserve` committed (finish, move away, re-placement)."""
        loads, i = self.loads, self.index
        loads.dec_pred[i] -= call.kv_pred
        loads.dec_count[i] -= 1
        loads.dec_ctx[i] -= call.ctx_share

    def advance(self, now: float) -> None:
        """Move the virtual token clock to ``now`` at the current rate."""
        if self.batch and now > self.t_v:
            self.v += (now - self.t_v) / self.step
        self.t_v = now

    def true_kv(self) -> float:
        """True KV tokens in use at the virtual clock ``v`` (call :meth:`advance` first)."""
        return self.true_base + len(self.batch) * self.v

    def admit(self, call: Call, now: float, reserve: bool = True) -> None:
        """Start decoding ``call`` (caller checked capacity and batch size). A preempted call
        resumes with ``call.generated`` tokens already made; ``reserve=False`` when its
        reservation was taken when its recompute began."""
        self.advance(now)
        call.v_admit = self.v
        g = call.generated
        if g == 0.0:
            call.v_finish = self.v + call.l_out
            call.v_finish_pred = self.v + call.l_out_pred
            call.ctx_term = call.l_in + 0.5 * call.v_finish - call.v_admit
            call.true_term = (0 if call.width > 1 else call.l_in) - call.v_admit
        else:  # resumed: its context is the prompt plus what it generated before
            call.v_finish = self.v + (call.l_out - g)
            call.v_finish_pred = self.v + max(call.l_out_pred - g, 1.0)
            call.ctx_term = (call.l_in + g) + 0.5 * call.v_finish - call.v_admit
            call.true_term = (call.l_in + g) - call.v_admit
        if reserve:
            self.used_kv += call.kv_res
        self.ctx_sum += call.ctx_term
        self.true_base += call.true_term
        heapq.heappush(self.batch, (call.v_finish, call.uid, call))

    def admit_rider(self, call: Call, now: float) -> None:
        """Start decoding a sample-group rider next to its leader: its KV (its own output; the
        shared prompt came with the leader) was reserved by the leader's :meth:`admit`."""
        call.v_admit = self.v
        call.v_finish = self.v + call.l_out
        call.v_finish_pred = self.v + call.l_out_pred
        call.ctx_term = call.l_in + 0.5 * call.v_finish - call.v_admit
        call.true_term = -call.v_admit
        self.ctx_sum += call.ctx_term
        self.true_base += call.true_term
        heapq.heappush(self.batch, (call.v_finish, call.uid, call))

    def finish_head(self) -> Call:
        """Remove the call with the smallest virtual finish; the clock is set to it exactly.

        Returns the call's ``kv_free`` tokens; a sample group's shared prompt is returned by the
        simulator when its last member finishes."""
        vf, _, call = heapq.heappop(self.batch)
        self.v = vf
        self.used_kv -= call.kv_free
        self.ctx_sum -= call.ctx_term
        self.true_base -= call.true_term
        return call

    def evict(self, call: Call) -> None:
        """Take a running call out of the batch (preemption at the current clock): its
        reservation and KV are freed, what it generated is kept in ``call.generated``."""
        self.batch.remove((call.v_finish, call.uid, call))
        heapq.heapify(self.batch)
        call.generated += self.v - call.v_admit
        self.used_kv -= call.kv_res
        self.ctx_sum -= call.ctx_term
        self.true_base -= call.true_term

    def rerate(self) -> float:
        """Recompute the step time after a batch change; returns the next finish delay (or inf)."""
        self.version += 1
        b = len(self.batch)
        if b == 0:
            self.step = 0.0
            self.ctx_sum = 0.0  # drop accumulated rounding while idle
            self.v = 0.0  # so a lone call on an idle instance sees the same numbers as alone
            return float("inf")
        ctx = self.ctx_sum + b * (self.v - 1.0) * 0.5
        self.step = self.latency.decode_step_time(b, ctx)
        return (self.batch[0][0] - self.v) * self.step


class SchedulerLoads:
    """The scheduler-visible load of every instance of a cluster, in flat lists indexed by
    instance: what Ŝ snapshots copy at every scheduling invocation (a list copy instead of a
    read of every instance). The engine writes the prefill entries (placements, prefill starts
    and ends), ``DecodeInstance.reserve``/``release`` the decode ones; the instances'
    ``queued_est``, ``committed_pred``, ... attributes read them.

    Prefill: ``pf_run_end`` (scheduler-visible end of the running prefill, -inf when idle),
    ``pf_queued`` (seconds of queued work), ``pf_tokens`` (prompt tokens queued or running).
    Decode: ``dec_pred`` (predicted KV tokens committed), ``dec_count`` (calls committed),
    ``dec_ctx`` (Σ L_in + L_out_pred/2 over them). Floats from the start, so Ŝ copies them as
    they are (sums of token counts are exact in float64).

    ``pf_qtokens`` and ``dec_q*``: the part of ``pf_tokens`` and ``dec_*`` that calls still
    waiting for their prefill hold (placed, not started), which a ``plan_depth`` snapshot
    leaves out of Ŝ in O(P + D) (integer and half-integer sums: exact)."""

    __slots__ = ("pf_run_end", "pf_queued", "pf_tokens", "dec_pred", "dec_count", "dec_ctx",
                 "pf_qtokens", "dec_qpred", "dec_qcount", "dec_qctx")

    def __init__(self, num_prefill: int, num_decode: int) -> None:
        self.pf_run_end = [-math.inf] * num_prefill
        self.pf_queued = [0.0] * num_prefill
        self.pf_tokens = [0.0] * num_prefill
        self.dec_pred = [0.0] * num_decode
        self.dec_count = [0] * num_decode
        self.dec_ctx = [0.0] * num_decode
        self.pf_qtokens = [0.0] * num_prefill
        self.dec_qpred = [0.0] * num_decode
        self.dec_qcount = [0] * num_decode
        self.dec_qctx = [0.0] * num_decode


def prefill_free_times(run_end: list[float], now: float, queued: list[float]) -> list[float]:
    """:func:`prefill_free_times_python`, compiled when :mod:`hexagent_gym.planning.kernels` is
    built."""
    kernel = kernels.prefill_free_times
    if kernel is None:
        return prefill_free_times_python(run_end, now, queued)
    return kernel(run_end, now, queued)


def prefill_free_times_python(run_end: list[float], now: float,
                              queued: list[float]) -> list[float]:
    """When a newly placed call could start on each prefill instance (scheduler-visible): after
    its running prefill's estimated end ``run_end[i]`` and ``queued[i]`` seconds of queued work
    (the instance's ``queued_est``, or less when calls being re-planned give theirs up). The
    one place this is computed (Ŝ snapshots and the fallback placement)."""
    return [(end if end > now else now) + (q if q > 0.0 else 0.0)
            for end, q in zip(run_end, queued, strict=True)]
