"""The event loop of one simulated episode: the clock, arrivals, reveals and completions.

:class:`Engine` owns the event queue and the episode's bookkeeping (workflows, calls, counters,
results). What happens on the instances (prefill, KV transfer, decode batching, preemption) is in
:class:`~hexagent_gym.sim.instance_flow.InstanceFlow`, and how calls get planned and placed
(decision points, plans, the fallback) in :class:`~hexagent_gym.sim.plan_flow.PlanFlow`; the three
share one object's state. :class:`hexagent_gym.sim.simulator.Simulator` adds the standalone horizons
H_w.

Lifecycle of a call (docs/architecture.md): hidden → waiting-prefill (revealed) → prefill on its
prefill instance (non-preemptive, one at a time) → KV transfer to its decode instance (transfers
run in parallel) → waiting-decode → decode with continuous batching → done, after which children
whose parents are all done are revealed ``tool_latency_s`` later. A decode preemption sends a
call back to waiting-decode; a free waiting-decode call may be moved to another instance once.
"""

from __future__ import annotations

import gc
import itertools
import math
import time
from collections.abc import Callable, Mapping
from heapq import heappop
from typing import TYPE_CHECKING, Any

import numpy as np

from hexagent_gym.futures.horizon_predictors import HorizonPredictor
from hexagent_gym.futures.horizon_tracker import HorizonTracker
from hexagent_gym.futures.predictors import predictor_from_config
from hexagent_gym.planning.cluster_tables import ClusterTables
from hexagent_gym.planning.decisions import DecisionPoint, Stage, earliest_finish_pick
from hexagent_gym.planning.entities import (
    UNPLANNED,
    Call,
    CallState,
    DecodeInstance,
    PrefillInstance,
    SchedulerLoads,
    Workflow,
)
from hexagent_gym.sim.events import EventQueue, Phase
from hexagent_gym.sim.fault_flow import FaultFlow
from hexagent_gym.sim.instance_flow import InstanceFlow
from hexagent_gym.sim.metrics import EpisodeResult, WorkflowRecord
from hexagent_gym.sim.plan_flow import PlanFlow
from hexagent_gym.sim.serving import (
    build_caches,
    check_group_width,
    form_group,
    workload_block_tokens,
)
from hexagent_gym.sim.timeline import build_timeline
from hexagent_gym.workload.arrivals import EpisodeWorkload
from hexagent_gym.workload.workload import check_kv_demand

if TYPE_CHECKING:
    from hexagent_gym.cluster.cluster import ClusterSpec

PickFn = Callable[[DecisionPoint], tuple[int, int, int]]
DecideFn = Callable[[DecisionPoint], object]  # makes some of a decision's picks (Engine.run)
# Enum members as module constants: CPython 3.11 reads `Stage.X` through EnumType's slow
# attribute hook (about 80 ns each), and these run several times per env step.
_CALLSTATE_DONE = CallState.DONE
_CALLSTATE_WAITING_PREFILL = CallState.WAITING_PREFILL
_PHASE_ARRIVAL = Phase.ARRIVAL
_PHASE_DECODE_DONE = Phase.DECODE_DONE
_PHASE_PLAN_LANDS = Phase.PLAN_LANDS
_PHASE_PREEMPT = Phase.PREEMPT
_PHASE_PREFILL_DONE = Phase.PREFILL_DONE
_PHASE_RECOMPUTE_DONE = Phase.RECOMPUTE_DONE
_PHASE_REVEAL = Phase.REVEAL
_PHASE_SCHEDULE = Phase.SCHEDULE
_PHASE_TRANSFER_DONE = Phase.TRANSFER_DONE
_STAGE_PREFILL = Stage.PREFILL

DECODE_ADMISSION = ("predicted", "true-demand")


class Engine(InstanceFlow, PlanFlow):
    """One episode of the cluster serving a sampled workload, without horizons of its own.

    Takes the arguments of :class:`hexagent_gym.sim.simulator.Simulator` except
    ``compute_horizons``; ``horizons`` is any object with ``get(spec) -> seconds`` (None: every
    ratio is 1, as in the standalone runs that compute horizons).

    With ``record_timeline=True`` the handlers append one tuple per interval (prefill, KV
    transfer, wait, recompute, decode) to ``_spans``, returned as ``EpisodeResult.timeline``;
    recording only reads the state (off, each recording site costs one ``is not None`` test).
    """

    def __init__(self, cluster: ClusterSpec, workload: EpisodeWorkload, *,
                 estimation_error: float = 0.0, rng: np.random.Generator | None = None,
                 decisions: bool = True, planning_latency: float | str = 0.0,
                 max_calls_per_decision: int | None = None, plan_depth: int | None = None,
                 horizons: Any = None,
                 tables: ClusterTables | None = None,
                 prefix_cache: bool = True, prefix_cache_tokens: float | None = None,
                 parallel_sampling: bool = True, length_predictor: Any = "oracle",
                 length_predictor_params: Mapping[str, Any] | None = None,
                 decode_admission: str = "predicted", free_decode_calls: bool = True,
                 record_timeline: bool = False, checked_specs: set[int] | None = None,
                 horizon_predictor: HorizonPredictor | None = None, faults: Any = None,
                 fault_seed: int = 0) -> None:
        if not 0.0 <= estimation_error < 1.0:
            raise ValueError(f"estimation_error must be in [0, 1), got {estimation_error}")
        if planning_latency != "measured" and not (
                isinstance(planning_latency, int | float) and planning_latency >= 0.0):
            raise ValueError("planning_latency must be seconds >= 0 or 'measured', got "
                             f"{planning_latency!r}")
        if decode_admission not in DECODE_ADMISSION:
            raise ValueError(f"decode_admission must be one of {', '.join(DECODE_ADMISSION)}, "
                             f"got {decode_admission!r}")
        if not isinstance(record_timeline, bool):
            raise ValueError(f"record_timeline must be True or False, got {record_timeline!r}")
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
        self.horizons = horizons  # H_w per workflow spec (``get``), or None: ratios of 1
        # Ĥ_w forecasts, refreshed at each decision point for the workflows it shows
        self.horizon_tracker = (HorizonTracker(horizon_predictor)
                                if horizon_predictor is not None else None)
        self.workload = workload
        # checked_specs: ids of workflow specs that passed these checks for this cluster and
        # serving options (the caller keeps the specs alive: an EpisodeFactory and its trace);
        # only the others are checked, then added
        fresh = (workload.workflows if checked_specs is None
                 else [w for w in workload.workflows if id(w) not in checked_specs])
        check_kv_demand(fresh, cluster.max_decode_kv_tokens, f"cluster '{cluster.name}'",
                        groups=parallel_sampling)
        check_group_width(fresh, cluster, parallel_sampling)
        if checked_specs is not None:
            checked_specs.update(map(id, fresh))
        self._decide = decisions
        self._latency = planning_latency
        self._init_plan_flow(max_calls_per_decision, plan_depth)
        self._eager_fallback = (not decisions) or planning_latency != 0.0
        self.loads = loads = SchedulerLoads(len(cluster.prefill), len(cluster.decode))
        self.prefill = [PrefillInstance(i, s.gpu, s.latency, loads)
                        for i, s in enumerate(cluster.prefill)]
        self.decode = [DecodeInstance(i, s.gpu, s.latency, s.kv_capacity_tokens, s.max_batch_size,
                                      loads)
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
        self._pending: DecisionPoint | None = None
        self._done_workflows = 0
        self.prompt_tokens = 0  # prompt tokens of every started call (riders included)
        self.cached_tokens = 0  # ... of which served from a prefix cache (or a group's prefill)
        self.pool_seconds = 0.0  # prefill-pool seconds of the computed work (load.pool_seconds)
        self.preemptions = 0
        # timeline recording (None: off). _seg_start: uid -> start of a resumed call's current
        # recompute or decode interval (its first decode interval starts at call.decode_start)
        self._spans: list[tuple] | None = [] if record_timeline else None
        self._seg_start: dict[int, float] = {}
        self._draw_errors(estimation_error, rng)
        self._next_arrival = 0
        self._push_next_arrival()
        self._handlers = {
            _PHASE_DECODE_DONE: self._on_decode_done,
            _PHASE_PREEMPT: self._on_preempt,
            _PHASE_RECOMPUTE_DONE: self._on_recompute_done,
            _PHASE_PREFILL_DONE: self._on_prefill_done,
            _PHASE_TRANSFER_DONE: self._on_transfer_done,
            _PHASE_REVEAL: self._reveal,
            _PHASE_ARRIVAL: self._on_arrival,
            _PHASE_PLAN_LANDS: self._on_plan_lands,
        }
        # instance faults (None: no fault, and no fault code runs; docs/faults.md)
        self._faults = FaultFlow.build(self, faults, fault_seed)

    # -- public API -------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """True when every workflow of the episode has finished."""
        return self._done_workflows == len(self.workload.workflows)

    def num_waiting(self, stage: Stage) -> int:
        """Calls currently waiting at ``stage`` (also those outside a decision's window)."""
        return len(self._waiting_prefill if stage == _STAGE_PREFILL else self._waiting_decode)

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
        heap = self.events.heap  # popped here directly: the loop runs a few times per step
        handlers = self._handlers
        if handlers is None:
            raise RuntimeError("this simulator was closed (Engine.close); build a new one")
        schedule = _PHASE_SCHEDULE
        while True:
            # Dispatch (start prefills, admit decodes) runs after the last event of an instant,
            # so it sees every completion, arrival and plan of that instant.
            if self._dispatch_due and (not heap or heap[0][0] > self.now):
                self._dispatch()
                continue
            if not heap:
                break
            t, phase, _, payload = heappop(heap)
            assert t >= self.now, "the clock went back"
            self.now = t
            if phase == schedule:
                dp = self._open_decision(payload)
                if dp is not None:
                    if self.horizon_tracker is not None:
                        self.horizon_tracker.refresh(self.finished, dp.calls)
                    self._pending = dp
                    self._wall += time.perf_counter() - t0
                    return dp
            else:
                handlers[phase](payload)
        self._wall += time.perf_counter() - t0
        assert self.done, "event queue drained with unfinished workflows"
        return None

    def run(self, pick: PickFn | None = None, policy_name: str = "",
            decide: DecideFn | None = None, pause_gc: bool = True,
            close: bool = False) -> EpisodeResult:
        """Run the episode to the end; ``pick`` answers each decision (default: the fallback).

        ``decide``, when given, is called first at every decision point and may make any
        number of its picks itself (a policy answering a whole decision at once); ``pick``
        answers the calls it leaves.

        ``pause_gc``: Python's cyclic garbage collector is paused while the episode runs and
        its result is built (resumed when this returns or raises): collections inside an
        episode free nothing, yet cost more the larger the cluster (docs/performance.md). Pass
        False when a policy of your own builds reference cycles it drops during the episode.

        ``close``: :meth:`close` the simulator once its result is built (still inside the
        pause), so the episode is freed at once instead of by a later full collection. For
        callers that own the simulator and whose policy keeps none of its calls."""
        pick = pick or earliest_finish_pick
        paused = pause_gc and gc.isenabled()
        if paused:
            gc.disable()
        try:
            dp = self.run_until_decision()
            while dp is not None:
                if decide is not None:
                    decide(dp)
                while not dp.done:
                    dp.pick(*pick(dp))
                dp = self.run_until_decision()
            result = self.result(
                policy_name or ("fallback" if pick is earliest_finish_pick else ""))
            if close:
                self.close()
        finally:
            if paused:
                gc.enable()
        return result

    def close(self) -> None:
        """Free the episode now: drop the simulator's workflows and break the reference cycles
        that would leave them to Python's cyclic garbage collector (each call's ``workflow``
        link, which becomes None, and the engine's table of its own bound handlers). Reference
        counting then frees every workflow and call that nobody else holds, at once, instead of
        a later full collection traversing them all (its cost: docs/performance.md).

        Afterwards the simulator cannot run (RuntimeError) and its ``workflows`` and
        ``finished`` are empty; calls a policy kept lose their workflow. Build the result
        first. Idempotent."""
        for wf in self.workflows:
            for c in wf.calls:
                c.workflow = None
        self.workflows = []
        self.finished = []
        self._handlers = None
        self._pending = None
        if self._faults is not None:
            self._faults = self._faults.detach()

    def result(self, policy_name: str = "") -> EpisodeResult:
        """Metrics of the finished episode."""
        if not self.done:
            raise RuntimeError("the episode has not finished; run it to the end first")
        records = [WorkflowRecord(w.spec.workflow_id, w.trace_index, w.arrival, w.finish_t,
                                  w.horizon, len(w.calls)) for w in self.workflows]
        if self.horizons is not None:
            ratios = np.array([r.ratio for r in records])
        else:
            ratios = np.ones(len(records))
        last = max((w.finish_t for w in self.workflows), default=0.0)
        span = float(self.workload.arrivals[-1]) if len(self.workload) else 0.0
        timeline = None if self._spans is None else build_timeline(
            self._spans, self.prefill, self.decode, self.workflows, ratios,
            {"cluster": self.cluster.name, "policy": policy_name})
        return EpisodeResult(ratios, records, self.num_calls, self.invocations,
                             self.decisions_made, self.scheduler_seconds, last, self._wall,
                             policy_name, np.array(self.invocation_seconds),
                             prompt_tokens=self.prompt_tokens, cached_tokens=self.cached_tokens,
                             prefill_load=self.pool_seconds / span if span > 0 else math.nan,
                             timeline=timeline, **self._regime_counters())

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
            **(self._faults.counters() if self._faults is not None else {}),
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
            # (prefill, decode, length) errors of call i at 3i, 3i+1, 3i+2: one flat list, not a
            # list per call for the garbage collector to track through the episode
            self._err = (1.0 + level * rng.uniform(-1.0, 1.0, size=(total, 3))).ravel().tolist()
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
            self.events.push(float(self.workload.arrivals[i]), _PHASE_ARRIVAL, i)
            self._next_arrival = i + 1

    # -- arrivals, reveals, completions ------------------------------------------------------
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
                j = 3 * (base + k)
                pf_e, dec_e, out_e = err[j], err[j + 1], err[j + 2]
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
        call.state = _CALLSTATE_WAITING_PREFILL
        call.reveal_t = self.now
        call.reveal_seq = seq = next(self._reveal_seq)
        call.queue_key = UNPLANNED + seq
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
        # alone on a cold cache it still reuses its own workflow's earlier prompts
        own = call.spec.own_hit if self.caches is not None else 0
        alone = tables.alone_prefill(call.l_in, own) if own else times
        call.pf_true = alone
        err = call.pf_err
        if err == 1.0:
            call.pf_cold, call.pf_cls, alone_est = times, per_class, alone
        else:  # tuples: the collector stops tracking them at its first pass (not so lists)
            call.pf_cold = tuple([x * err for x in times])
            call.pf_cls = tuple([x * err for x in per_class])
            alone_est = [x * err for x in alone] if own else call.pf_cold
        call.pf_est = call.pf_cold
        self._waiting_prefill[call.uid] = call
        if self._decide:
            self._unplaced.append(call)
            if err == 1.0 and call.dec_err == 1.0:
                est = tables.alone_estimate(alone, call.l_in, own, call.l_out_pred)
            else:
                est = tables.standalone_estimate(alone_est, call.l_in, call.l_out_pred,
                                                 call.dec_err)
            call.est_duration = est
            start = 0.0
            for pi in call.spec.parents:
                parent_ef = wf.calls[pi].ef
                if parent_ef > start:
                    start = parent_ef
            call.ef_start = start + call.spec.tool_latency_s if call.spec.parents else 0.0
            call.ef = call.ef_start + est
            wf.refresh_h_est()
            self._trigger(_STAGE_PREFILL)
        if self._eager_fallback:
            self._place_fallback(call)

    def _complete(self, call: Call, inst: DecodeInstance) -> None:
        now = self.now
        call.state = _CALLSTATE_DONE
        call.finish_t = now
        spans = self._spans
        if spans is not None:  # its last decode interval (its only one unless preempted)
            spans.append(("decode", inst.index, self._seg_start.pop(call.uid, call.decode_start),
                          now, call.uid, call.l_out - call.generated, -1))
        lead = call.lead if call.lead is not None else (call if call.width > 1 else None)
        if lead is None:
            inst.release(call)
        else:
            lead.group_left -= 1
            if lead.group_left == 0:  # the group's last sample: its prompt and plan go too
                inst.used_kv -= lead.l_in
                inst.true_base -= lead.l_in
                inst.release(lead)
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
            if call.lead is None:  # pf_true is alone_prefill(l_in, own), as on reveal
                own = call.spec.own_hit if self.caches is not None else 0
                true_alone = self.tables.alone_estimate(call.pf_true, call.l_in, own,
                                                        call.l_out)
            else:  # a rider holds its leader's pf_true
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
                self.events.push(now + child.spec.tool_latency_s, _PHASE_REVEAL, child)
        if wf.num_done == len(calls):
            wf.finish_t = now
            self._done_workflows += 1
            self.finished.append(wf)
