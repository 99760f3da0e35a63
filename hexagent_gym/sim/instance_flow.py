"""What happens on the instances: prefill, KV transfer, decode admission and batching,
preemption and recompute (a mixin of :class:`~hexagent_gym.sim.engine.Engine`; one object's state).

Dispatch (starting prefills, admitting decodes) runs after the last event of an instant, so it
sees every completion, arrival and plan of that instant; handlers only mark instances dirty.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from hexagent_gym.planning.decisions import Stage
from hexagent_gym.planning.entities import PREEMPTED, UNPLANNED, Call, CallState, head_index
from hexagent_gym.sim.events import Phase
from hexagent_gym.sim.plan_flow import queued_share
from hexagent_gym.sim.serving import call_riders

if TYPE_CHECKING:
    from hexagent_gym.planning.entities import DecodeInstance, PrefillInstance


# Enum members as module constants: CPython 3.11 reads `Stage.X` through EnumType's slow
# attribute hook (about 80 ns each), and these run several times per env step.
_CALLSTATE_DECODE = CallState.DECODE
_CALLSTATE_PREFILL = CallState.PREFILL
_CALLSTATE_TRANSFER = CallState.TRANSFER
_CALLSTATE_WAITING_DECODE = CallState.WAITING_DECODE
_PHASE_DECODE_DONE = Phase.DECODE_DONE
_PHASE_PREEMPT = Phase.PREEMPT
_PHASE_PREFILL_DONE = Phase.PREFILL_DONE
_PHASE_RECOMPUTE_DONE = Phase.RECOMPUTE_DONE
_PHASE_TRANSFER_DONE = Phase.TRANSFER_DONE
_STAGE_DECODE = Stage.DECODE


class InstanceFlow:
    """Event handlers and dispatch of prefill and decode instances."""

    def _on_prefill_done(self, p: int) -> None:
        inst = self.prefill[p]
        call = inst.running
        inst.running = None
        loads = self.loads
        loads.pf_run_end[p] = -math.inf
        loads.pf_tokens[p] -= call.l_in
        call.prefill_end = self.now
        call.state = _CALLSTATE_TRANSFER
        if self.caches is not None:
            call.held = self.caches[p].insert(call.spec.blocks, call.held)
        d = call.decode_inst
        xfer = self.tables.setup_list[p][d] + call.l_in * self.tables.spt_list[p][d]
        call.transfer_end = self.now + xfer
        if call.width > 1:
            for r in call_riders(call):
                r.state = _CALLSTATE_TRANSFER
                r.prefill_end = self.now
                r.transfer_end = call.transfer_end
        spans = self._spans
        if spans is not None:
            spans.append(("prefill", p, call.prefill_start, self.now, call.uid, call.l_in,
                          call.hit))
            spans.append(("transfer", d, self.now, call.transfer_end, call.uid, call.l_in, p))
        self.events.push(call.transfer_end, _PHASE_TRANSFER_DONE, call)
        self._mark_prefill(p)

    def _on_transfer_done(self, call: Call) -> None:
        if call.held:  # its KV has left: the prompt's blocks become evictable
            self.caches[call.prefill_inst].unlock(call.spec.blocks, call.held)
            call.held = 0
        call.state = _CALLSTATE_WAITING_DECODE
        call.wait_since = self.now
        if call.width > 1:
            for r in call_riders(call):
                r.state = _CALLSTATE_WAITING_DECODE
        call.queue_key = UNPLANNED + next(self._fifo_seq)
        self.decode[call.decode_inst].waiting.append(call)
        self._waiting_decode[call.uid] = call
        if self._decide:
            self._trigger(_STAGE_DECODE)
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
        self.events.push(self.now + delay, _PHASE_DECODE_DONE, (inst.index, inst.version))
        if not self._overrun:
            return
        b = len(inst.batch)
        at_finish = inst.true_base + b * inst.batch[0][0]
        if at_finish > inst.capacity:
            v_cross = (inst.capacity - inst.true_base) / b
            when = self.now + max(v_cross - inst.v, 0.0) * inst.step
            self.events.push(when, _PHASE_PREEMPT, (inst.index, inst.version))

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
        spans = self._spans
        if spans is not None:  # the decode interval the preemption ends
            spans.append(("decode", d, self._seg_start.pop(victim.uid, victim.decode_start),
                          self.now, victim.uid, inst.v - victim.v_admit, -1))
        inst.evict(victim)
        self.preemptions += 1
        victim.preempted += 1
        # re-reserve at least what it now holds plus one token (its prediction proved short)
        need = victim.l_in + max(victim.l_out_pred, math.ceil(victim.generated) + 1)
        victim.kv_res = victim.kv_free = min(need, inst.capacity)
        victim.state = _CALLSTATE_WAITING_DECODE
        victim.wait_since = self.now
        victim.queue_key = PREEMPTED + next(self._fifo_seq)  # back to the queue's front
        inst.waiting.append(victim)
        inst.inbound[victim.uid] = victim
        self._waiting_decode[victim.uid] = victim
        inst.hold = bool(inst.batch)  # wait until memory frees (a finish) before admitting
        self._reschedule(inst)
        if self._decide:
            self._trigger(_STAGE_DECODE)
        self._mark_decode(d)

    def _on_recompute_done(self, call: Call) -> None:
        """A resumed call's KV is rebuilt: it rejoins its instance's batch."""
        inst = self.decode[call.decode_inst]
        inst.advance(self.now)
        del inst.recomputing[call.uid]
        spans = self._spans
        if spans is not None:
            spans.append(("recompute", inst.index, self._seg_start[call.uid], self.now,
                          call.uid, call.l_in + call.generated, -1))
            self._seg_start[call.uid] = self.now  # its next decode interval starts now
        inst.true_base -= call.l_in + call.generated  # now held as a batch member instead
        inst.admit(call, self.now, reserve=False)
        self._reschedule(inst)
        self._mark_decode(inst.index)

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
        dec = self.decode[call.decode_inst]  # its KV commitment stays, no longer re-placeable
        dec.inbound[call.uid] = dec.queued.pop(call.uid)
        queued_share(self.loads, call, p, call.decode_inst, -1)
        call.state = _CALLSTATE_PREFILL
        call.prefill_start = now
        queued = self.loads.pf_queued
        queued[p] = queued[p] - call.pf_queued if inst.queue else 0.0
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
        self.loads.pf_run_end[p] = now + call.pf_run
        call.hit = hit
        call.cached = None  # the scheduler's view of waiting calls only
        call.view_levels = None
        self.prompt_tokens += l_in
        self.cached_tokens += hit
        self.pool_seconds += tables.pool_seconds(l_in, hit)
        call.workflow.last_prefill = p
        if call.width > 1:
            for r in call_riders(call):
                r.state = _CALLSTATE_PREFILL
                r.prefill_start = now
                r.prefill_inst, r.decode_inst = p, call.decode_inst
                r.hit = r.l_in
                self.prompt_tokens += r.l_in
                self.cached_tokens += r.l_in
        self.events.push(now + duration, _PHASE_PREFILL_DONE, p)

    def _admit(self, inst: DecodeInstance) -> None:
        waiting = inst.waiting
        if inst.hold or not waiting:
            return
        overrun = self._overrun
        if overrun:
            inst.advance(self.now)
        spans = self._spans
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
            call.state = _CALLSTATE_DECODE
            call.decode_wait += self.now - call.wait_since
            if spans is not None and self.now > call.wait_since:
                spans.append(("wait", inst.index, call.wait_since, self.now, call.uid, 0,
                              -1))
            inst.admits += 1
            call.admit_seq = inst.admits
            if call.generated:  # preempted before: rebuild its KV first
                inst.used_kv += call.kv_res
                inst.true_base += call.l_in + call.generated
                redo = inst.latency.prefill_time(int(call.l_in + call.generated))
                inst.recomputing[call.uid] = (self.now + redo, call)
                if spans is not None:
                    self._seg_start[call.uid] = self.now
                self.events.push(self.now + redo, _PHASE_RECOMPUTE_DONE, call)
                admitted = True  # its KV counts from now: the crossing instant moves
                continue
            call.decode_start = self.now
            inst.admit(call, self.now)
            call.workflow.last_decode = inst.index
            if call.width > 1:
                call.group_left = call.width
                inst.true_base += call.l_in  # the shared prompt, held until the last sample
                for r in call_riders(call):
                    r.state = _CALLSTATE_DECODE
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

    def _mark_prefill(self, p: int) -> None:
        self._dirty_prefill.add(p)
        self._dispatch_due = True

    def _mark_decode(self, d: int) -> None:
        self._dirty_decode.add(d)
        self._dispatch_due = True
