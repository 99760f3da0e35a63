"""How waiting calls get planned and placed: scheduling invocations, decision points, plans
landing (synchronously or late), free decode moves and the core's fallback placement (a mixin of
:class:`~hexagent_gym.sim.engine.Engine`; one object's state).
"""

from __future__ import annotations

import itertools
import time

from hexagent_gym.planning.decisions import DecisionPoint, Stage
from hexagent_gym.planning.entities import (
    PLANNED,
    UNPLANNED,
    Call,
    CallState,
    SchedulerLoads,
    prefill_free_times,
)
from hexagent_gym.planning.placement import earliest_pair
from hexagent_gym.planning.plan_state import snapshot
from hexagent_gym.sim.events import Phase
from hexagent_gym.sim.prefix_cache import match_levels, view_of_levels
from hexagent_gym.sim.serving import call_riders

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

    def _init_plan_flow(self, max_calls_per_decision: int | None,
                        plan_depth: int | None) -> None:
        """Check and keep the window options (Engine's arguments) and start the bookkeeping.

        Raises:
            ValueError: a bound below 1, or both set (they are two rules for one window)."""
        for name, k in (("max_calls_per_decision", max_calls_per_decision),
                        ("plan_depth", plan_depth)):
            if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
                raise ValueError(f"{name} must be >= 1 or None, got {k!r}")
        if max_calls_per_decision is not None and plan_depth is not None:
            raise ValueError("set max_calls_per_decision or plan_depth, not both")
        self._window = max_calls_per_decision
        self._depth = plan_depth
        # revealed since the last prefill plan was applied, in reveal order: the only waiting
        # calls that can be unplaced then (so applying a plan never scans the whole queue)
        self._unplaced: list[Call] = []
        # the calls each stage's last applied plan ranked: the only ones holding PLANNED keys
        self._keyed: list[list[Call]] = [[], []]
        self._schedule_pushed = [False, False]
        self._inflight = [False, False]
        self._replan = [False, False]

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
        depth = self._depth
        if k is not None:
            calls = list(itertools.islice(waiting.values(), k))
        elif depth is not None and len(waiting) > depth:
            calls = self._depth_window(stage, waiting, depth)
        else:
            calls = list(waiting.values())
        if stage == _STAGE_PREFILL and self.caches is not None:
            for c in calls:
                self._view(c)
        # a plan_depth window that leaves waiting calls out: Ŝ leaves out every call still
        # waiting for its prefill (those left out queue behind the planned ones)
        skip = depth is not None and k is None and len(self._waiting_prefill) > depth
        state = snapshot(self.tables, self.now, self.loads, self.decode, calls,
                         stage == _STAGE_PREFILL, skip)
        state.free_decode = self.free_decode_calls
        self.invocations += 1
        return DecisionPoint(stage, self.now, calls, state, wall)

    def _depth_window(self, stage: Stage, waiting: dict[int, Call], depth: int) -> list[Call]:
        """``plan_depth``'s window: the ``depth`` oldest waiting calls of the stage and, at the
        prefill stage, every call not placed yet (revealed since the last prefill plan), oldest
        first. The others keep their placement and wait behind the planned calls in reveal
        order (as outside a ``max_calls_per_decision`` window) until they are among the
        oldest; a bounded window keeps an invocation's cost independent of the queue's length
        (docs/overload.md)."""
        calls = list(itertools.islice(waiting.values(), depth))
        if stage == _STAGE_PREFILL:
            last = calls[-1].reveal_seq  # the dict is in reveal order: newer calls follow it
            calls += [c for c in self._unplaced if c.reveal_seq > last and c.prefill_inst < 0
                      and c.state == _CALLSTATE_WAITING_PREFILL]
        return calls

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
        keyed = []
        previous = self._keyed[stage]
        prefill = self.prefill
        if stage == _STAGE_PREFILL:
            for rank, (call, p, d, delta) in enumerate(plan):
                if call.state != _CALLSTATE_WAITING_PREFILL:
                    continue
                planned.add(call.uid)
                call.proj_release = origin + delta
                # the queue's heap gets an entry only for a new key or a new insertion (the
                # insertion carries the key): the same heads, fewer stale entries to pop and
                # rebuild (re-planning the plan_depth window reaches here ~30 times per call)
                key = PLANNED + rank
                if call.prefill_inst != p or call.decode_inst != d:
                    call.queue_key = key
                    if call.prefill_inst < 0:
                        self._enqueue_prefill(call, p, d)
                    else:
                        self._replace(call, p, d)
                elif call.queue_key != key:
                    call.queue_key = key
                    prefill[p].queue.rekey(call)
                keyed.append(call)
            # every waiting call the plan left goes behind the planned ones in reveal order:
            # only the last plan's calls have another key, and only calls revealed since it
            # can be unplaced (then placed by the fallback, in reveal order as they wait)
            for call in previous:
                if call.uid not in planned and call.state == _CALLSTATE_WAITING_PREFILL:
                    key = UNPLANNED + call.reveal_seq
                    if call.queue_key != key:
                        call.queue_key = key
                        prefill[call.prefill_inst].queue.rekey(call)
            for call in self._unplaced:
                if (call.prefill_inst < 0 and call.uid not in planned
                        and call.state == _CALLSTATE_WAITING_PREFILL):
                    self._place_fallback(call)
            self._unplaced = []
        else:
            for rank, (call, _, d, delta) in enumerate(plan):
                if call.state == _CALLSTATE_WAITING_DECODE:
                    planned.add(call.uid)
                    call.proj_release = origin + delta
                    if d != call.decode_inst:
                        self._move(call, d)
                        continue
                    call.queue_key = PLANNED + rank
                    keyed.append(call)
                    self._mark_decode(d)
            # a waiting call the plan left that holds a planned key (one of the last plan's)
            # goes behind the planned ones in FIFO order: new FIFO numbers, handed out in the
            # queue's order, so the scan runs only when there is such a call
            if any(c.uid not in planned and c.state == _CALLSTATE_WAITING_DECODE
                   and PLANNED <= c.queue_key < UNPLANNED for c in previous):
                for call in self._waiting_decode.values():
                    if call.uid not in planned and PLANNED <= call.queue_key < UNPLANNED:
                        call.queue_key = UNPLANNED + next(self._fifo_seq)
        self._keyed[stage] = keyed

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
        dec.queued[call.uid] = call
        queued_share(loads, call, p, d, 1)
        self._mark_prefill(p)

    def _replace(self, call: Call, p: int, d: int) -> None:
        """``_unplace`` then ``_enqueue_prefill(call, p, d)`` of a placed waiting call in one
        frame: the same operations on the loads in the same order (so the same floats). A
        ``plan_depth`` window re-places about 20 calls per simulated call under overload, where
        the frames of the two methods and of the four they call cost more than their
        arithmetic."""
        p0, d0 = call.prefill_inst, call.decode_inst
        src = self.prefill[p0]
        src.queue.remove(call)
        loads = self.loads
        l_in, kv, share, uid = call.l_in, call.kv_pred, call.ctx_share, call.uid
        pf_tokens, pf_queued, pf_qtokens = loads.pf_tokens, loads.pf_queued, loads.pf_qtokens
        dec_pred, dec_count, dec_ctx = loads.dec_pred, loads.dec_count, loads.dec_ctx
        dec_qpred, dec_qcount, dec_qctx = loads.dec_qpred, loads.dec_qcount, loads.dec_qctx
        # _unplace (DecodeInstance.release, queued_share with sign -1: x + -1 * y is x - y)
        pf_tokens[p0] -= l_in
        pf_queued[p0] = pf_queued[p0] - call.pf_queued if src.queue else 0.0
        dec_pred[d0] -= kv
        dec_count[d0] -= 1
        dec_ctx[d0] -= share
        del self.decode[d0].queued[uid]
        pf_qtokens[p0] -= l_in
        dec_qpred[d0] -= kv
        dec_qcount[d0] -= 1
        dec_qctx[d0] -= share
        # _enqueue_prefill (DecodeInstance.reserve, queued_share with sign 1)
        call.prefill_inst = p
        call.decode_inst = d
        self.prefill[p].queue.append(call)
        pf_tokens[p] += l_in
        call.pf_queued = est = call.pf_est[p]
        pf_queued[p] += est
        dec_pred[d] += kv
        dec_count[d] += 1
        dec_ctx[d] += share
        self.decode[d].queued[uid] = call
        pf_qtokens[p] += l_in
        dec_qpred[d] += kv
        dec_qcount[d] += 1
        dec_qctx[d] += share
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
        del dec.queued[call.uid]
        queued_share(loads, call, p, d, -1)
        call.prefill_inst = call.decode_inst = -1


def queued_share(loads: SchedulerLoads, call: Call, p: int, d: int, sign: int) -> None:
    """Add (``sign`` 1) or take back (-1) what a placed call whose prefill has not started holds
    of the loads (``SchedulerLoads.pf_qtokens`` and ``dec_q*``)."""
    loads.pf_qtokens[p] += sign * call.l_in
    loads.dec_qpred[d] += sign * call.kv_pred
    loads.dec_qcount[d] += sign
    loads.dec_qctx[d] += sign * call.ctx_share
