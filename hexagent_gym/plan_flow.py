"""How waiting calls get planned and placed: scheduling invocations, decision points, plans
landing (synchronously or late), free decode moves and the core's fallback placement (a mixin of
:class:`~hexagent_gym.engine.Engine`; one object's state).
"""

from __future__ import annotations

import itertools
import time

from hexagent_gym.decisions import DecisionPoint, Stage
from hexagent_gym.entities import PLANNED, UNPLANNED, Call, CallState, prefill_free_times
from hexagent_gym.events import Phase
from hexagent_gym.planner import earliest_pair, snapshot
from hexagent_gym.prefix_cache import match_levels, view_of_levels
from hexagent_gym.serving import call_riders

# Enum members as module constants: CPython 3.11 reads `Stage.X` through EnumType's slow
# attribute hook (about 80 ns each), and these run several times per env step.
_CALLSTATE_TRANSFER = CallState.TRANSFER
_CALLSTATE_WAITING_DECODE = CallState.WAITING_DECODE
_CALLSTATE_WAITING_PREFILL = CallState.WAITING_PREFILL
_PHASE_PLAN_LANDS = Phase.PLAN_LANDS
_PHASE_SCHEDULE = Phase.SCHEDULE
_PHASE_TRANSFER_DONE = Phase.TRANSFER_DONE
_STAGE_PREFILL = Stage.PREFILL


class PlanFlow:
    """Scheduling invocations and placements."""

    def _view(self, call: Call) -> None:
        """Refresh the scheduler's view of a waiting call against the caches as they are now:
        ``cached`` tokens per prefill instance and cache-aware ``pf_est``."""
        caches = self.caches
        if caches is None:
            return
        # a re-planned call's view is usually unchanged: rebuild it only when the match changed
        levels = match_levels(caches[0].holders, call.spec.blocks)
        if levels != call.view_levels:
            call.view_levels = levels
            call.cached, call.pf_est = view_of_levels(self.tables, levels, self.block_tokens,
                                                      call)

    # -- scheduling -----------------------------------------------------------------------------
    def _trigger(self, stage: Stage) -> None:
        if self._inflight[stage]:
            self._replan[stage] = True
        elif not self._schedule_pushed[stage]:
            self._schedule_pushed[stage] = True
            self.events.push(self.now, _PHASE_SCHEDULE, stage)

    def _open_decision(self, stage: Stage) -> DecisionPoint | None:
        self._schedule_pushed[stage] = False
        waiting = self._waiting_prefill if stage == _STAGE_PREFILL else self._waiting_decode
        if not waiting:
            return None
        wall = time.perf_counter()
        k = self._window
        calls = list(waiting.values()) if k is None else list(itertools.islice(
            waiting.values(), k))
        if stage == _STAGE_PREFILL and self.caches is not None:
            for c in calls:
                self._view(c)
        state = snapshot(self.tables, self.now, self.loads, self.decode, calls,
                         stage == _STAGE_PREFILL)
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
            self.events.push(self.now + latency, _PHASE_PLAN_LANDS, (dp.stage, dp.plan, dp.now))

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
        if stage == _STAGE_PREFILL:
            for rank, (call, p, d, delta) in enumerate(plan):
                if call.state != _CALLSTATE_WAITING_PREFILL:
                    continue
                planned.add(call.uid)
                if (call.prefill_inst, call.decode_inst) != (p, d):
                    self._unplace(call)
                    self._enqueue_prefill(call, p, d)
                call.proj_release = origin + delta
                call.queue_key = PLANNED + rank
            for call in self._waiting_prefill.values():
                if call.uid not in planned:
                    call.queue_key = UNPLANNED + call.reveal_seq
                    if call.prefill_inst < 0:
                        self._place_fallback(call)
        else:
            for rank, (call, _, d, delta) in enumerate(plan):
                if call.state == _CALLSTATE_WAITING_DECODE:
                    planned.add(call.uid)
                    call.proj_release = origin + delta
                    if d != call.decode_inst:
                        self._move(call, d)
                        continue
                    call.queue_key = PLANNED + rank
                    self._mark_decode(d)
            for call in self._waiting_decode.values():
                if call.uid not in planned and PLANNED <= call.queue_key < UNPLANNED:
                    call.queue_key = UNPLANNED + next(self._fifo_seq)

    def _move(self, call: Call, d: int) -> None:
        """Re-place a free waiting decode call on decode instance ``d``: its KV is sent again
        (the transfer time from its prefill instance to d) and it waits there."""
        src = self.decode[call.decode_inst]
        src.waiting.remove(call)
        del src.inbound[call.uid]
        del self._waiting_decode[call.uid]
        src.release(call)
        call.decode_wait += self.now - call.wait_since
        spans = self._spans
        if spans is not None and self.now > call.wait_since:  # timeline: the wait it ends here
            spans.append(("wait", src.index, call.wait_since, self.now, call.uid, 0, -1))
        dst = self.decode[d]
        dst.reserve(call)
        dst.inbound[call.uid] = call
        call.decode_inst = d
        call.moved = True  # one move per call: it cannot bounce between instances
        p = call.prefill_inst
        call.state = _CALLSTATE_TRANSFER
        call.transfer_end = self.now + (self.tables.setup_list[p][d]
                                        + call.l_in * self.tables.spt_list[p][d])
        if call.width > 1:
            for r in call_riders(call):
                r.decode_inst = d
                r.state = _CALLSTATE_TRANSFER
                r.transfer_end = call.transfer_end  # the group's KV arrives together
        self.moves += 1
        if spans is not None:  # timeline: its KV sent again, to d
            spans.append(("transfer", d, self.now, call.transfer_end, call.uid, call.l_in, p))
        self.events.push(call.transfer_end, _PHASE_TRANSFER_DONE, call)
        self._mark_decode(src.index)

    def _place_fallback(self, call: Call) -> None:
        """FIFO placement at the earliest projected finish (the core's fallback).

        Reads the live state directly; Ŝ is only built when a decode limit binds.
        """
        now = self.now
        self._view(call)
        loads = self.loads
        free = prefill_free_times(loads.pf_run_end, now, loads.pf_queued)
        dec = self.decode

        def slow_start(d: int, need: float, over: int) -> float:
            state = snapshot(self.tables, now, loads, dec, [call], True)
            return state.slow_start(d, need, over)

        p, d, delta = earliest_pair(self.tables, now, free, loads.dec_pred, loads.dec_count,
                                    loads.dec_ctx, call, slow_start)
        call.proj_release = now + delta
        self._enqueue_prefill(call, p, d)

    def _enqueue_prefill(self, call: Call, p: int, d: int) -> None:
        """Place a waiting call: join p's queue and commit its predicted KV to d."""
        call.prefill_inst = p
        call.decode_inst = d
        inst = self.prefill[p]
        inst.queue.append(call)
        loads = self.loads
        loads.pf_tokens[p] += call.l_in
        call.pf_queued = call.pf_est[p]
        loads.pf_queued[p] += call.pf_queued
        dec = self.decode[d]
        dec.reserve(call)
        dec.inbound[call.uid] = call
        self._mark_prefill(p)

    def _unplace(self, call: Call) -> None:
        """Undo ``_enqueue_prefill`` for a still-waiting call that a plan moves."""
        p, d = call.prefill_inst, call.decode_inst
        if p < 0:
            return
        src = self.prefill[p]
        src.queue.remove(call)
        loads = self.loads
        loads.pf_tokens[p] -= call.l_in
        loads.pf_queued[p] = loads.pf_queued[p] - call.pf_queued if src.queue else 0.0
        dec = self.decode[d]
        dec.release(call)
        del dec.inbound[call.uid]
        call.prefill_inst = call.decode_inst = -1
