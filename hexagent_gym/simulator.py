"""The discrete-event simulator of a heterogeneous P-D cluster serving agentic workflows.

Lifecycle of a call (docs/simulator.md): hidden → waiting-prefill (revealed) → prefill on its
prefill instance (non-preemptive, one at a time) → KV transfer to its decode instance (transfers
run in parallel) → waiting-decode → decode with continuous batching → done, after which children
whose parents are all done are revealed ``tool_latency_s`` later. A decode preemption sends a
call back to waiting-decode; a free waiting-decode call may be moved to another instance.

Scheduling: arrivals and reveals trigger a prefill invocation, transfer completions a
decode invocation. ``run_until_decision`` advances to the next invocation and returns a
:class:`~hexagent_gym.decisions.DecisionPoint`; the caller picks every call of it and calls
``run_until_decision`` again, which applies the plan. With ``decisions=False`` no invocation is
exposed and every call follows the fallback (FIFO order, earliest projected finish placement).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from hexagent_gym.arrivals import EpisodeWorkload
from hexagent_gym.decisions import DecisionPoint, Stage, earliest_finish_pick
from hexagent_gym.entities import (
    PLANNED,
    PREEMPTED,
    UNPLANNED,
    Call,
    CallState,
    DecodeInstance,
    PrefillInstance,
    Workflow,
    head_index,
)
from hexagent_gym.events import EventQueue, Phase
from hexagent_gym.horizon import HorizonCache
from hexagent_gym.metrics import EpisodeResult, WorkflowRecord
from hexagent_gym.planner import ClusterTables, earliest_pair, snapshot
from hexagent_gym.predictors import predictor_from_config
from hexagent_gym.prefix_cache import match_levels
from hexagent_gym.serving import (
    build_caches,
    call_riders,
    check_group_width,
    form_group,
    workload_block_tokens,
)
from hexagent_gym.workload import check_kv_demand

if TYPE_CHECKING:
    from hexagent_gym.cluster import ClusterSpec

PickFn = Callable[[DecisionPoint], tuple[int, int, int]]
DECODE_ADMISSION = ("predicted", "true-demand")


class Simulator:
    """One episode of the cluster serving a sampled workload.

    Args:
        cluster: the cluster (``hexagent_gym.cluster.load_cluster``).
        workload: the episode's workflows and arrival times (``arrivals.sample_episode``).
        estimation_error: level e of the multiplicative error on scheduler-visible prefill and
            decode times and predicted output lengths; each call draws factors ``1 + e·U(−1, 1)``.
        rng: the episode's generator; used only to draw the estimation-error factors.
        decisions: expose decision points (False: fallback only, the fastest mode).
        planning_latency: seconds between an invocation and its plan landing (0 = synchronous),
            or ``"measured"`` to use the invocation's wall time (not deterministic).
        max_calls_per_decision: window size K (None = every waiting call). The window holds the
            K oldest waiting calls of the stage; the rest keep their placement and wait FIFO
            behind planned calls until they enter a window.
        horizons: cache of standalone horizons H_w to share across episodes on this cluster.
        tables: precomputed cluster tables to share across episodes.
        compute_horizons: compute H_w for each workflow (the standalone runs themselves don't).
        prefix_cache: keep a prefix (KV) cache on every prefill instance
            (:mod:`hexagent_gym.prefix_cache`); a prefill then computes only its uncached suffix.
        prefix_cache_tokens: KV tokens each prefill instance's cache holds: None sizes it from
            the instance's KV memory, ``math.inf`` makes it unbounded.
        parallel_sampling: serve a sample group (the ``n`` samples of one request) as one
            request: one prefill and one transfer, decode sharing the prompt's KV.
        length_predictor: the scheduler-visible output-length predictor
            (:mod:`hexagent_gym.predictors`; a name, or a predictor object); ``"oracle"`` shows
            the true lengths. Estimation error ``e`` multiplies on top of it.
        length_predictor_params: keyword arguments of a named predictor.
        decode_admission: ``"predicted"`` — decode instances reserve a call's predicted demand
            at admission and preempt (recompute) when the true KV in use reaches capacity;
            ``"true-demand"`` — reserve the true demand (never preempts; the regime before).
        free_decode_calls: a call waiting at its decode instance that the instance has not
            served yet may be re-placed on another decode instance by a plan (its KV is sent
            again: the P→D transfer time); a preempted or already moved call stays (locked).
    """

    def __init__(self, cluster: ClusterSpec, workload: EpisodeWorkload, *,
                 estimation_error: float = 0.0, rng: np.random.Generator | None = None,
                 decisions: bool = True, planning_latency: float | str = 0.0,
                 max_calls_per_decision: int | None = None, horizons: HorizonCache | None = None,
                 tables: ClusterTables | None = None, compute_horizons: bool = True,
                 prefix_cache: bool = True, prefix_cache_tokens: float | None = None,
                 parallel_sampling: bool = True, length_predictor: Any = "oracle",
                 length_predictor_params: Mapping[str, Any] | None = None,
                 decode_admission: str = "predicted", free_decode_calls: bool = True) -> None:
        if not 0.0 <= estimation_error < 1.0:
            raise ValueError(f"estimation_error must be in [0, 1), got {estimation_error}")
        if planning_latency != "measured" and not (
                isinstance(planning_latency, int | float) and planning_latency >= 0.0):
            raise ValueError("planning_latency must be seconds >= 0 or 'measured', got "
                             f"{planning_latency!r}")
        if max_calls_per_decision is not None and max_calls_per_decision < 1:
            raise ValueError(f"max_calls_per_decision must be >= 1 or None, got "
                             f"{max_calls_per_decision}")
        if decode_admission not in DECODE_ADMISSION:
            raise ValueError(f"decode_admission must be one of {', '.join(DECODE_ADMISSION)}, "
                             f"got {decode_admission!r}")
        self.predictor = (predictor_from_config(length_predictor, length_predictor_params)
                          if isinstance(length_predictor, str) else length_predictor)
        self.decode_admission = decode_admission
        self.free_decode_calls = bool(free_decode_calls)
        self.moves = 0  # free decode calls re-placed on another decode instance
        self.cluster = cluster
        self.tables = tables if tables is not None else ClusterTables(cluster)
        self.prefix_cache = bool(prefix_cache)
        self.parallel_sampling = bool(parallel_sampling)
        self.block_tokens = workload_block_tokens(workload.workflows)
        self.caches = build_caches(cluster, prefix_cache_tokens, self.block_tokens) \
            if prefix_cache else None
        if compute_horizons:
            self.horizons = horizons if horizons is not None else HorizonCache(
                cluster, self.tables, prefix_cache=prefix_cache,
                prefix_cache_tokens=prefix_cache_tokens, parallel_sampling=parallel_sampling)
        else:
            self.horizons = None
        self.workload = workload
        check_kv_demand(workload.workflows, cluster.max_decode_kv_tokens,
                        f"cluster '{cluster.name}'", groups=parallel_sampling)
        check_group_width(workload.workflows, cluster, parallel_sampling)
        self._decide = decisions
        self._latency = planning_latency
        self._window = max_calls_per_decision
        self._eager_fallback = (not decisions) or planning_latency != 0.0
        self.prefill = [PrefillInstance(i, s.gpu, s.latency) for i, s in enumerate(cluster.prefill)]
        self.decode = [DecodeInstance(i, s.gpu, s.latency, s.kv_capacity_tokens, s.max_batch_size)
                       for i, s in enumerate(cluster.decode)]
        self.now = 0.0
        self.events = EventQueue()
        self.workflows: list[Workflow] = []  # arrived so far, in arrival order
        self.finished: list[Workflow] = []  # completed so far, in completion order
        self.num_calls = 0
        self.invocations = 0
        self.decisions_made = 0
        self.scheduler_seconds = 0.0
        self.invocation_seconds: list[float] = []  # wall time of each invocation (policy + Ŝ)
        self._wall = 0.0
        self._reveal_seq = itertools.count()
        self._fifo_seq = itertools.count()
        self._waiting_prefill: dict[int, Call] = {}
        self._waiting_decode: dict[int, Call] = {}
        self._dirty_prefill: set[int] = set()
        self._dirty_decode: set[int] = set()
        self._dispatch_due = False
        self._schedule_pushed = [False, False]
        self._inflight = [False, False]
        self._replan = [False, False]
        self._pending: DecisionPoint | None = None
        self._done_workflows = 0
        self.prompt_tokens = 0  # prompt tokens of every started call (riders included)
        self.cached_tokens = 0  # ... of which served from a prefix cache (or a group's prefill)
        self.pool_seconds = 0.0  # prefill-pool seconds of the computed work (load.pool_seconds)
        self.preemptions = 0
        self._draw_errors(estimation_error, rng)
        self._next_arrival = 0
        self._push_next_arrival()
        self._handlers = {
            Phase.DECODE_DONE: self._on_decode_done,
            Phase.PREEMPT: self._on_preempt,
            Phase.RECOMPUTE_DONE: self._on_recompute_done,
            Phase.PREFILL_DONE: self._on_prefill_done,
            Phase.TRANSFER_DONE: self._on_transfer_done,
            Phase.REVEAL: self._reveal,
            Phase.ARRIVAL: self._on_arrival,
            Phase.PLAN_LANDS: self._on_plan_lands,
        }

    # -- public API -------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """True when every workflow of the episode has finished."""
        return self._done_workflows == len(self.workload.workflows)

    def num_waiting(self, stage: Stage) -> int:
        """Calls currently waiting at ``stage`` (also those outside a decision's window)."""
        return len(self._waiting_prefill if stage == Stage.PREFILL else self._waiting_decode)

    def run_until_decision(self) -> DecisionPoint | None:
        """Advance to the next decision point; None when the episode has drained.

        Raises:
            RuntimeError: the previous decision point still has unpicked calls.
        """
        t0 = time.perf_counter()
        dp = self._pending
        if dp is not None:
            if not dp.done:
                raise RuntimeError(f"the current decision point still has {len(dp.remaining)} "
                                   "unpicked calls; pick them all before advancing")
            self._pending = None
            self._close_decision(dp)
        events = self.events
        heap = events.heap
        handlers = self._handlers
        while True:
            # Dispatch (start prefills, admit decodes) runs after the last event of an instant,
            # so it sees every completion, arrival and plan of that instant.
            if self._dispatch_due and (not heap or heap[0][0] > self.now):
                self._dispatch()
                continue
            if not heap:
                break
            t, phase, _, payload = events.pop()
            assert t >= self.now, "the clock went back"
            self.now = t
            if phase == Phase.SCHEDULE:
                dp = self._open_decision(payload)
                if dp is not None:
                    self._pending = dp
                    self._wall += time.perf_counter() - t0
                    return dp
            else:
                handlers[phase](payload)
        self._wall += time.perf_counter() - t0
        assert self.done, "event queue drained with unfinished workflows"
        return None

    def run(self, pick: PickFn | None = None, policy_name: str = "") -> EpisodeResult:
        """Run the episode to the end; ``pick`` answers each decision (default: the fallback)."""
        pick = pick or earliest_finish_pick
        dp = self.run_until_decision()
        while dp is not None:
            while not dp.done:
                dp.pick(*pick(dp))
            dp = self.run_until_decision()
        return self.result(policy_name or ("fallback" if pick is earliest_finish_pick else ""))

    def result(self, policy_name: str = "") -> EpisodeResult:
        """Metrics of the finished episode."""
        if not self.done:
            raise RuntimeError("the episode has not finished; run it to the end first")
        records = [WorkflowRecord(w.spec.workflow_id, w.trace_index, w.arrival, w.finish_t,
                                  w.horizon, len(w.calls)) for w in self.workflows]
        if self.horizons is not None:
            ratios = np.array([(r.finish - r.arrival) / r.horizon for r in records])
        else:
            ratios = np.ones(len(records))
        last = max((w.finish_t for w in self.workflows), default=0.0)
        span = float(self.workload.arrivals[-1]) if len(self.workload) else 0.0
        return EpisodeResult(ratios, records, self.num_calls, self.invocations,
                             self.decisions_made, self.scheduler_seconds, last, self._wall,
                             policy_name, np.array(self.invocation_seconds),
                             prompt_tokens=self.prompt_tokens, cached_tokens=self.cached_tokens,
                             prefill_load=self.pool_seconds / span if span > 0 else math.nan,
                             **self._regime_counters())

    def _regime_counters(self) -> dict[str, Any]:
        """How hard decode was pressed (EpisodeResult's regime fields)."""
        calls = [c for w in self.workflows for c in w.calls]
        n = len(calls)
        return {
            "decode_kv_peak": max((d.peak_kv / d.capacity for d in self.decode), default=0.0),
            "preemptions": self.preemptions,
            "decode_wait_mean": sum(c.decode_wait for c in calls) / n if n else 0.0,
            "decode_kv_delayed": sum(c.kv_blocked for c in calls) / n if n else 0.0,
            "decode_moves": self.moves,
        }

    # -- set-up ---------------------------------------------------------------------------------
    def _draw_errors(self, level: float, rng: np.random.Generator | None) -> None:
        workflows = self.workload.workflows
        total = sum(len(w.calls) for w in workflows)
        self._call_offset = np.concatenate(
            [[0], np.cumsum([len(w.calls) for w in workflows])]).astype(int)
        if level == 0.0:
            self._err = None
        else:
            if rng is None:
                raise ValueError("estimation_error > 0 needs the episode's rng")
            self._err = (1.0 + level * rng.uniform(-1.0, 1.0, size=(total, 3))).tolist()
        # predicted output lengths, drawn after the error factors (the oracle draws nothing)
        if self.predictor.name == "oracle":
            self._pred = None
        else:
            true = np.fromiter((c.output_tokens for w in workflows for c in w.calls),
                               dtype=np.int64, count=total)
            self._pred = self.predictor.predict(true, rng).tolist()
        # preemption can only happen when some call may outgrow its reservation
        self._overrun = self.decode_admission != "true-demand" and (
            self._pred is not None or self._err is not None)

    def _push_next_arrival(self) -> None:
        i = self._next_arrival
        if i < len(self.workload.workflows):
            self.events.push(float(self.workload.arrivals[i]), Phase.ARRIVAL, i)
            self._next_arrival = i + 1

    # -- event handlers -------------------------------------------------------------------------
    def _on_arrival(self, i: int) -> None:
        spec = self.workload.workflows[i]
        wf = Workflow(i, spec, self.now, int(self.workload.trace_indices[i]))
        if self.horizons is not None:
            wf.horizon = self.horizons.get(spec)
        self.workflows.append(wf)
        base = int(self._call_offset[i])
        err, pred = self._err, self._pred
        for k, cs in enumerate(spec.calls):
            out = cs.output_tokens if pred is None else pred[base + k]
            if err is None:
                c = Call(base + k, wf, k, cs, out, 1.0, 1.0)
            else:
                pf_e, dec_e, out_e = err[base + k]
                c = Call(base + k, wf, k, cs, max(1, round(out * out_e)), pf_e, dec_e)
            if self.decode_admission == "true-demand":
                c.kv_res = c.kv_free = c.kv_true
            wf.calls[k] = c
        if self.parallel_sampling:
            for cs in spec.calls:
                if cs.riders:
                    form_group(wf, cs.group)
        self.num_calls += len(spec.calls)
        self._push_next_arrival()
        for c in wf.calls:
            if not c.spec.parents:
                self._reveal(c)

    def _reveal(self, call: Call) -> None:
        call.state = CallState.WAITING_PREFILL
        call.reveal_t = self.now
        call.reveal_seq = seq = next(self._reveal_seq)
        call.queue_key = (UNPLANNED, seq)
        wf = call.workflow
        wf.open_calls.append(call)
        lead = call.lead
        if lead is not None:  # a sample-group rider: revealed with its leader, rides its prefill
            call.pf_true, call.pf_cold, call.pf_est, call.pf_cls = (
                lead.pf_true, lead.pf_cold, lead.pf_est, lead.pf_cls)
            if self._decide:
                call.est_duration, call.ef_start, call.ef = (
                    lead.est_duration, lead.ef_start, lead.ef)
            return
        tables = self.tables
        times, per_class = tables.prefill_times(call.l_in)
        own = call.spec.own_hit if self.caches is not None else 0
        if own:  # alone on a cold cache it still reuses its own workflow's earlier prompts
            alone_cls = tables.prefill_times_hit(call.l_in, own)
            alone = [alone_cls[k] for k in tables.pf_class_list]
        else:
            alone = times
        call.pf_true = alone
        err = call.pf_err
        if err == 1.0:
            call.pf_cold, call.pf_cls, alone_est = times, per_class, alone
        else:
            call.pf_cold = [x * err for x in times]
            call.pf_cls = [x * err for x in per_class]
            alone_est = [x * err for x in alone] if own else call.pf_cold
        call.pf_est = call.pf_cold
        self._waiting_prefill[call.uid] = call
        if self._decide:
            est = tables.standalone_estimate(alone_est, call.l_in, call.l_out_pred, call.dec_err)
            call.est_duration = est
            start = 0.0
            for pi in call.spec.parents:
                parent_ef = wf.calls[pi].ef
                if parent_ef > start:
                    start = parent_ef
            call.ef_start = start + call.spec.tool_latency_s if call.spec.parents else 0.0
            call.ef = call.ef_start + est
            wf.refresh_h_est()
            self._trigger(Stage.PREFILL)
        if self._eager_fallback:
            self._place_fallback(call)

    def _view(self, call: Call) -> None:
        """Refresh the scheduler's view of a waiting call against the caches as they are now:
        ``cached`` tokens per prefill instance and cache-aware ``pf_est``."""
        caches = self.caches
        if caches is None:
            return
        levels = match_levels(caches[0].holders, call.spec.blocks)
        if not levels:
            call.cached = None
            call.pf_est = call.pf_cold
            return
        tables, block, l_in, err = self.tables, self.block_tokens, call.l_in, call.pf_err
        cls = tables.pf_class_list
        hits = [0] * len(caches)
        est = list(call.pf_cold)
        for k, mask in levels:
            h = k * block
            if h > l_in:
                h = l_in
            per_class = tables.prefill_times_hit(l_in, h)
            while mask:
                low = mask & -mask
                p = low.bit_length() - 1
                mask ^= low
                hits[p] = h
                est[p] = per_class[cls[p]] * err
        call.cached = hits
        call.pf_est = est

    def _on_prefill_done(self, p: int) -> None:
        inst = self.prefill[p]
        call = inst.running
        inst.running = None
        inst.run_end = -math.inf
        inst.load_tokens -= call.l_in
        call.prefill_end = self.now
        call.state = CallState.TRANSFER
        if self.caches is not None:
            call.held = self.caches[p].insert(call.spec.blocks, call.held)
        d = call.decode_inst
        xfer = self.tables.setup_list[p][d] + call.l_in * self.tables.spt_list[p][d]
        call.transfer_end = self.now + xfer
        if call.width > 1:
            for r in call_riders(call):
                r.state = CallState.TRANSFER
                r.prefill_end = self.now
                r.transfer_end = call.transfer_end
        self.events.push(call.transfer_end, Phase.TRANSFER_DONE, call)
        self._mark_prefill(p)

    def _on_transfer_done(self, call: Call) -> None:
        if call.held:  # its KV has left: the prompt's blocks become evictable
            self.caches[call.prefill_inst].unlock(call.spec.blocks, call.held)
            call.held = 0
        call.state = CallState.WAITING_DECODE
        call.wait_since = self.now
        if call.width > 1:
            for r in call_riders(call):
                r.state = CallState.WAITING_DECODE
        call.queue_key = (UNPLANNED, next(self._fifo_seq))
        self.decode[call.decode_inst].waiting.append(call)
        self._waiting_decode[call.uid] = call
        if self._decide:
            self._trigger(Stage.DECODE)
        self._mark_decode(call.decode_inst)

    def _on_decode_done(self, payload: tuple[int, int]) -> None:
        d, version = payload
        inst = self.decode[d]
        if version != inst.version:
            return  # the batch changed after this event was scheduled
        inst.t_v = self.now
        inst.v = inst.batch[0][0]  # the finishing calls' KV is at its largest
        kv = inst.true_kv()
        if kv > inst.peak_kv:
            inst.peak_kv = kv
        finished = [inst.finish_head()]
        batch = inst.batch
        while batch and batch[0][0] <= inst.v:
            finished.append(inst.finish_head())
        inst.hold = False  # memory freed: admissions may resume
        for call in finished:
            self._complete(call, inst)
        self._reschedule(inst)
        self._mark_decode(d)

    def _reschedule(self, inst: DecodeInstance) -> None:
        """After a batch change: the next finish, and with overruns possible the instant the
        true KV in use reaches capacity (a preemption) if that comes first."""
        delay = inst.rerate()
        if delay == float("inf"):
            return
        self.events.push(self.now + delay, Phase.DECODE_DONE, (inst.index, inst.version))
        if not self._overrun:
            return
        b = len(inst.batch)
        at_finish = inst.true_base + b * inst.batch[0][0]
        if at_finish > inst.capacity:
            v_cross = (inst.capacity - inst.true_base) / b
            when = self.now + max(v_cross - inst.v, 0.0) * inst.step
            self.events.push(when, Phase.PREEMPT, (inst.index, inst.version))

    def _on_preempt(self, payload: tuple[int, int]) -> None:
        """True KV use reached capacity: preempt the most recently admitted call that decodes
        alone (LIFO, as vLLM); its KV is dropped and recomputed when it is admitted again."""
        d, version = payload
        inst = self.decode[d]
        if version != inst.version:
            return
        inst.advance(self.now)
        inst.peak_kv = max(inst.peak_kv, min(inst.true_kv(), float(inst.capacity)))
        victim = max((c for _, _, c in inst.batch if c.width == 1 and c.lead is None),
                     key=lambda c: c.admit_seq)
        inst.evict(victim)
        self.preemptions += 1
        victim.preempted += 1
        # re-reserve at least what it now holds plus one token (its prediction proved short)
        need = victim.l_in + max(victim.l_out_pred, math.ceil(victim.generated) + 1)
        victim.kv_res = victim.kv_free = min(need, inst.capacity)
        victim.state = CallState.WAITING_DECODE
        victim.wait_since = self.now
        victim.queue_key = (PREEMPTED, next(self._fifo_seq))  # back to the queue's front
        inst.waiting.append(victim)
        inst.inbound[victim.uid] = victim
        self._waiting_decode[victim.uid] = victim
        inst.hold = bool(inst.batch)  # wait until memory frees (a finish) before admitting
        self._reschedule(inst)
        if self._decide:
            self._trigger(Stage.DECODE)
        self._mark_decode(d)

    def _on_recompute_done(self, call: Call) -> None:
        """A resumed call's KV is rebuilt: it rejoins its instance's batch."""
        inst = self.decode[call.decode_inst]
        inst.advance(self.now)
        del inst.recomputing[call.uid]
        inst.true_base -= call.l_in + call.generated  # now held as a batch member instead
        inst.admit(call, self.now, reserve=False)
        self._reschedule(inst)
        self._mark_decode(inst.index)

    def _complete(self, call: Call, inst: DecodeInstance) -> None:
        now = self.now
        call.state = CallState.DONE
        call.finish_t = now
        lead = call.lead if call.lead is not None else (call if call.width > 1 else None)
        if lead is None:
            inst.committed_pred -= call.kv_pred
            inst.committed_count -= 1
            inst.sched_ctx -= call.l_in + 0.5 * call.l_out_pred
        else:
            lead.group_left -= 1
            if lead.group_left == 0:  # the group's last sample: its prompt and plan go too
                inst.used_kv -= lead.l_in
                inst.true_base -= lead.l_in
                inst.committed_pred -= lead.kv_pred
                inst.committed_count -= 1
                inst.sched_ctx -= lead.l_in + 0.5 * lead.l_out_pred
        wf = call.workflow
        wf.open_calls.remove(call)
        parent_service = 0.0
        for pi in call.spec.parents:
            s = wf.calls[pi].service
            if s > parent_service:
                parent_service = s
        call.service = parent_service + (call.prefill_end - call.prefill_start) + (
            now - call.decode_start)
        if call.service > wf.service:
            wf.service = call.service
        if self._decide:
            true_alone = self.tables.standalone_estimate(
                call.pf_true, call.l_in, call.l_out, 1.0)
            call.ef = call.ef_start + true_alone
            if call.ef > wf.h_est_done:
                wf.h_est_done = call.ef
            wf.refresh_h_est()
        wf.num_done += 1
        calls = wf.calls
        for ci in call.spec.children:
            child = calls[ci]
            child.pending_parents -= 1
            if child.pending_parents == 0:
                self.events.push(now + child.spec.tool_latency_s, Phase.REVEAL, child)
        if wf.num_done == len(calls):
            wf.finish_t = now
            self._done_workflows += 1
            self.finished.append(wf)

    def _dispatch(self) -> None:
        self._dispatch_due = False
        if self._dirty_prefill:
            for p in sorted(self._dirty_prefill):
                inst = self.prefill[p]
                if inst.running is None and inst.queue:
                    self._start_prefill(inst, inst.pop_next())
            self._dirty_prefill.clear()
        if self._dirty_decode:
            for d in sorted(self._dirty_decode):
                self._admit(self.decode[d])
            self._dirty_decode.clear()

    def _start_prefill(self, inst: PrefillInstance, call: Call) -> None:
        p = inst.index
        now = self.now
        del self._waiting_prefill[call.uid]
        call.state = CallState.PREFILL
        call.prefill_start = now
        inst.queued_est = inst.queued_est - call.pf_queued if inst.queue else 0.0
        inst.running = call
        l_in = call.l_in
        tables = self.tables
        caches = self.caches
        if caches is None:
            duration = call.pf_true[p]
            call.pf_run = call.pf_est[p]
            hit = 0
        else:
            k = caches[p].lock(call.spec.blocks, -1, touch=False)
            call.held = k
            hit = k * self.block_tokens
            if hit > l_in:
                hit = l_in
            duration = tables.prefill_times_hit(l_in, hit)[tables.pf_class_list[p]]
            call.pf_run = duration * call.pf_err
        inst.run_end = now + call.pf_run
        call.hit = hit
        call.cached = None  # the scheduler's view of waiting calls only
        self.prompt_tokens += l_in
        self.cached_tokens += hit
        self.pool_seconds += tables.pool_seconds(l_in, hit)
        call.workflow.last_prefill = p
        if call.width > 1:
            for r in call_riders(call):
                r.state = CallState.PREFILL
                r.prefill_start = now
                r.prefill_inst, r.decode_inst = p, call.decode_inst
                r.hit = r.l_in
                self.prompt_tokens += r.l_in
                self.cached_tokens += r.l_in
        self.events.push(now + duration, Phase.PREFILL_DONE, p)

    def _admit(self, inst: DecodeInstance) -> None:
        waiting = inst.waiting
        if inst.hold or not waiting:
            return
        overrun = self._overrun
        if overrun:
            inst.advance(self.now)
        admitted = False
        while waiting and len(inst.batch) < inst.max_batch:
            best = head_index(waiting)
            call = waiting[best]
            if call.width > 1 and len(inst.batch) + call.width > inst.max_batch:
                break  # strict queue order: no smaller call overtakes the head
            if inst.used_kv + call.kv_res > inst.capacity or (overrun and not self._fits_now(
                    inst, call)):
                idle = not inst.batch and not inst.recomputing
                if not (idle and overrun and self._fits_now(inst, call)):
                    self._kv_blocked(waiting)
                    break  # an idle instance admits a head whose KV fits, reservation or not
            waiting.pop(best)
            del self._waiting_decode[call.uid]
            del inst.inbound[call.uid]
            call.state = CallState.DECODE
            call.decode_wait += self.now - call.wait_since
            inst.admits += 1
            call.admit_seq = inst.admits
            if call.generated:  # preempted before: rebuild its KV first
                inst.used_kv += call.kv_res
                inst.true_base += call.l_in + call.generated
                redo = inst.latency.prefill_time(int(call.l_in + call.generated))
                inst.recomputing[call.uid] = (self.now + redo, call)
                self.events.push(self.now + redo, Phase.RECOMPUTE_DONE, call)
                admitted = True  # its KV counts from now: the crossing instant moves
                continue
            call.decode_start = self.now
            inst.admit(call, self.now)
            call.workflow.last_decode = inst.index
            if call.width > 1:
                call.group_left = call.width
                inst.true_base += call.l_in  # the shared prompt, held until the last sample
                for r in call_riders(call):
                    r.state = CallState.DECODE
                    r.decode_start = self.now
                    r.decode_wait = call.decode_wait
                    inst.admit_rider(r, self.now)
            admitted = True
        if admitted:
            kv = inst.true_kv()
            if kv > inst.peak_kv:
                inst.peak_kv = kv
            self._reschedule(inst)

    @staticmethod
    def _fits_now(inst: DecodeInstance, call: Call) -> bool:
        """The head's prompt (and what it generated before a preemption) fits the KV truly in
        use now."""
        return inst.true_kv() + call.l_in + call.generated <= inst.capacity

    @staticmethod
    def _kv_blocked(waiting: list[Call]) -> None:
        for c in waiting:
            c.kv_blocked = True

    # -- scheduling -----------------------------------------------------------------------------
    def _trigger(self, stage: Stage) -> None:
        if self._inflight[stage]:
            self._replan[stage] = True
        elif not self._schedule_pushed[stage]:
            self._schedule_pushed[stage] = True
            self.events.push(self.now, Phase.SCHEDULE, stage)

    def _open_decision(self, stage: Stage) -> DecisionPoint | None:
        self._schedule_pushed[stage] = False
        waiting = self._waiting_prefill if stage == Stage.PREFILL else self._waiting_decode
        if not waiting:
            return None
        wall = time.perf_counter()
        k = self._window
        calls = list(waiting.values()) if k is None else list(itertools.islice(
            waiting.values(), k))
        if stage == Stage.PREFILL and self.caches is not None:
            for c in calls:
                self._view(c)
        state = snapshot(self.tables, self.now, self.prefill, self.decode, calls,
                         stage == Stage.PREFILL)
        state.free_decode = self.free_decode_calls
        self.invocations += 1
        return DecisionPoint(stage, self.now, calls, state, wall)

    def _close_decision(self, dp: DecisionPoint) -> None:
        spent = time.perf_counter() - dp.wall_start
        self.scheduler_seconds += spent
        self.invocation_seconds.append(spent)
        self.decisions_made += len(dp.plan)
        latency = spent if self._latency == "measured" else float(self._latency)
        if latency <= 0.0:
            self._apply(dp.stage, dp.plan, dp.now)
        else:
            self._inflight[dp.stage] = True
            self.events.push(self.now + latency, Phase.PLAN_LANDS, (dp.stage, dp.plan, dp.now))

    def _on_plan_lands(self, payload: tuple[Stage, list, float]) -> None:
        stage, plan, origin = payload
        self._inflight[stage] = False
        self._apply(stage, plan, origin)
        if self._replan[stage]:
            self._replan[stage] = False
            self._trigger(stage)

    def _apply(self, stage: Stage, plan: list[tuple[Call, int, int, float]],
               origin: float) -> None:
        """Apply a plan made at ``origin`` to the calls that still wait at that stage (a late
        plan skips calls that started meanwhile)."""
        planned = set()
        if stage == Stage.PREFILL:
            for rank, (call, p, d, delta) in enumerate(plan):
                if call.state != CallState.WAITING_PREFILL:
                    continue
                planned.add(call.uid)
                if (call.prefill_inst, call.decode_inst) != (p, d):
                    self._unplace(call)
                    self._enqueue_prefill(call, p, d)
                call.proj_release = origin + delta
                call.queue_key = (PLANNED, rank)
            for call in self._waiting_prefill.values():
                if call.uid not in planned:
                    call.queue_key = (UNPLANNED, call.reveal_seq)
                    if call.prefill_inst < 0:
                        self._place_fallback(call)
        else:
            for rank, (call, _, d, delta) in enumerate(plan):
                if call.state == CallState.WAITING_DECODE:
                    planned.add(call.uid)
                    call.proj_release = origin + delta
                    if d != call.decode_inst:
                        self._move(call, d)
                        continue
                    call.queue_key = (PLANNED, rank)
                    self._mark_decode(d)
            for call in self._waiting_decode.values():
                if call.uid not in planned and call.queue_key[0] == PLANNED:
                    call.queue_key = (UNPLANNED, next(self._fifo_seq))

    def _move(self, call: Call, d: int) -> None:
        """Re-place a free waiting decode call on decode instance ``d``: its KV is sent again
        (the transfer time from its prefill instance to d) and it waits there."""
        src = self.decode[call.decode_inst]
        src.waiting.remove(call)
        del src.inbound[call.uid]
        del self._waiting_decode[call.uid]
        src.committed_pred -= call.kv_pred
        src.committed_count -= 1
        src.sched_ctx -= call.l_in + 0.5 * call.l_out_pred
        call.decode_wait += self.now - call.wait_since
        dst = self.decode[d]
        dst.committed_pred += call.kv_pred
        dst.committed_count += 1
        dst.sched_ctx += call.l_in + 0.5 * call.l_out_pred
        dst.inbound[call.uid] = call
        call.decode_inst = d
        call.moved = True  # one move per call: it cannot bounce between instances
        p = call.prefill_inst
        call.state = CallState.TRANSFER
        call.transfer_end = self.now + (self.tables.setup_list[p][d]
                                        + call.l_in * self.tables.spt_list[p][d])
        if call.width > 1:
            for r in call_riders(call):
                r.decode_inst = d
                r.state = CallState.TRANSFER
        self.moves += 1
        self.events.push(call.transfer_end, Phase.TRANSFER_DONE, call)
        self._mark_decode(src.index)

    def _place_fallback(self, call: Call) -> None:
        """FIFO placement at the earliest projected finish (the core's fallback).

        Reads the live state directly; Ŝ is only built when a decode limit binds.
        """
        now = self.now
        self._view(call)
        free = []
        for inst in self.prefill:
            end = inst.run_end
            free.append((end if end > now else now) + max(inst.queued_est, 0.0))
        dec = self.decode

        def slow_start(d: int, need: float, over: int) -> float:
            state = snapshot(self.tables, now, self.prefill, dec, [call], True)
            return state.slow_start(d, need, over)

        p, d, delta = earliest_pair(
            self.tables, now, free, [float(x.committed_pred) for x in dec],
            [x.committed_count for x in dec], [x.sched_ctx for x in dec], call, slow_start)
        call.proj_release = now + delta
        self._enqueue_prefill(call, p, d)

    def _enqueue_prefill(self, call: Call, p: int, d: int) -> None:
        """Place a waiting call: join p's queue and commit its predicted KV to d."""
        call.prefill_inst = p
        call.decode_inst = d
        inst = self.prefill[p]
        inst.queue.append(call)
        inst.load_tokens += call.l_in
        call.pf_queued = call.pf_est[p]
        inst.queued_est += call.pf_queued
        dec = self.decode[d]
        dec.committed_pred += call.kv_pred
        dec.committed_count += 1
        dec.sched_ctx += call.l_in + 0.5 * call.l_out_pred
        dec.inbound[call.uid] = call
        self._mark_prefill(p)

    def _unplace(self, call: Call) -> None:
        """Undo ``_enqueue_prefill`` for a still-waiting call that a plan moves."""
        p, d = call.prefill_inst, call.decode_inst
        if p < 0:
            return
        src = self.prefill[p]
        src.queue.remove(call)
        src.load_tokens -= call.l_in
        src.queued_est = src.queued_est - call.pf_queued if src.queue else 0.0
        dec = self.decode[d]
        dec.committed_pred -= call.kv_pred
        dec.committed_count -= 1
        dec.sched_ctx -= call.l_in + 0.5 * call.l_out_pred
        del dec.inbound[call.uid]
        call.prefill_inst = call.decode_inst = -1

    def _mark_prefill(self, p: int) -> None:
        self._dirty_prefill.add(p)
        self._dispatch_due = True

    def _mark_decode(self, d: int) -> None:
        self._dirty_decode.add(d)
        self._dispatch_due = True
