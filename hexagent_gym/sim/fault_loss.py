"""What a failure or a drain does to the work on an instance (a mixin of
:class:`~hexagent_gym.sim.fault_flow.FaultFlow`, docs/faults.md): which calls lose work, how the
instance is emptied, and how the calls go back to waiting-prefill to be placed and served again.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Any

from hexagent_gym.planning.decisions import Stage
from hexagent_gym.planning.entities import UNPLANNED, CallState
from hexagent_gym.sim.events import Phase
from hexagent_gym.sim.serving import call_riders

if TYPE_CHECKING:
    from hexagent_gym.planning.entities import Call

_INF = math.inf
_DONE, _WP = CallState.DONE, CallState.WAITING_PREFILL
_PREFILL, _TRANSFER = CallState.PREFILL, CallState.TRANSFER


class FaultLoss:
    """Failing and draining instances (state: :class:`~hexagent_gym.sim.fault_flow.FaultFlow`'s)."""

    def _drop(self, match: Any) -> None:
        heap = self.e.events.heap
        heap[:] = [ev for ev in heap if not match(ev)]
        heapq.heapify(heap)

    def _abort_prefill(self, p: int) -> Call:
        """Stop prefill instance ``p``'s running call (its KV is lost) and free the instance."""
        e = self.e
        inst = e.prefill[p]
        call = inst.running
        self._drop(lambda ev: ev[1] == Phase.PREFILL_DONE and ev[3] == p)
        inst.running = None
        e.loads.pf_run_end[p] = -_INF
        e.loads.pf_tokens[p] -= call.l_in
        if call.held:
            e.caches[p].unlock(call.spec.blocks, call.held)
            call.held = 0
        e._mark_prefill(p)
        return call

    def _drain(self, pool: str, i: int) -> None:
        """Calls only *planned* on the instance (their prefill has not started) are re-placed;
        what runs there, or is on its way, finishes there."""
        e = self.e
        if pool == "prefill":
            planned = list(e.prefill[i].queue)
        else:
            planned = list(e.decode[i].queued.values())
        for c in planned:
            e._unplace(c)
        self._requeue(planned, [])

    def _fail(self, pool: str, i: int) -> None:
        e = self.e
        lost: list[Call] = []
        if pool == "prefill":
            inst = e.prefill[i]
            planned = list(inst.queue)
            if inst.running is not None:
                lost.append(self._abort_prefill(i))
            sent = [ev[3] for ev in e.events.heap if ev[1] == Phase.TRANSFER_DONE
                    and ev[3].prefill_inst == i and not ev[3].moved]
            if sent:  # KV on its way from the failed instance: lost with it
                gone = {c.uid for c in sent}
                self._drop(lambda ev: ev[1] == Phase.TRANSFER_DONE and ev[3].uid in gone)
                lost += sorted(sent, key=reveal_order)
            for c in lost:
                dec = e.decode[c.decode_inst]
                dec.release(c)
                del dec.inbound[c.uid]
            for c in planned:
                e._unplace(c)
            if e.caches is not None:
                for c in lost:
                    c.held = 0
                e.caches[i].clear()
        else:
            inst = e.decode[i]
            inst.advance(e.now)
            planned = list(inst.queued.values())
            for c in planned:
                e._unplace(c)
            for c in list(inst.inbound.values()):
                if c.state == _PREFILL:
                    self._abort_prefill(c.prefill_inst)
                elif c.state == _TRANSFER:
                    uid = c.uid
                    self._drop(lambda ev, uid=uid: ev[1] == Phase.TRANSFER_DONE
                               and ev[3].uid == uid)
                    if c.held:
                        e.caches[c.prefill_inst].unlock(c.spec.blocks, c.held)
                        c.held = 0
                else:  # waiting at the instance (its KV had landed)
                    del e._waiting_decode[c.uid]
                lost.append(c)
            if inst.recomputing:
                ids = set(inst.recomputing)
                self._drop(lambda ev: ev[1] == Phase.RECOMPUTE_DONE and ev[3].uid in ids)
                lost += [c for _, c in inst.recomputing.values()]
            for _, _, c in inst.batch:
                c.generated += inst.v - c.v_admit  # decoded so far: lost with the KV
                lost.append(c)
            _reset_decode(inst)
            loads = e.loads
            loads.dec_pred[i] = loads.dec_ctx[i] = 0.0
            loads.dec_count[i] = 0
        self._requeue(planned, lost)

    def _requeue(self, planned: list[Call], lost: list[Call]) -> None:
        """Send ``planned`` (placed, nothing started) and ``lost`` (work lost) calls back to
        waiting-prefill, to be re-placed by the next plan (or the fallback) and served again."""
        e = self.e
        self.replaced += len(planned)
        calls = list(planned)
        lost = sorted(lost, key=reveal_order)
        # each lost call's sample group (its leader), read before any group is split below
        leads = [c.lead if c.lead is not None else (c if c.width > 1 else None) for c in lost]
        seen: set[int] = set()
        for c, lead in zip(lost, leads, strict=True):
            self.reexecuted += 1
            self.recomputed_tokens += (c.l_in - c.hit if c.lead is None else 0) + c.generated
            if lead is None:
                calls.append(c)
            elif lead.uid not in seen:
                seen.add(lead.uid)
                members = [lead, *call_riders(lead)]
                if all(m.state != _DONE for m in members):
                    for r in members[1:]:
                        _reset(r, e)
                    calls.append(lead)
                else:  # some samples finished: the others are served on their own
                    for m in members:
                        if m.state != _DONE:
                            _split(m, e)
                            calls.append(m)
        if not calls:
            return
        uids = {c.uid for c in calls}
        assert len(uids) == len(calls), "a call is re-queued once"
        e._keyed[0] = [k for k in e._keyed[0] if k.uid not in uids]
        for c in calls:
            _reset(c, e)
            e._waiting_prefill[c.uid] = c
            if e._decide:
                e._unplaced.append(c)
        sort_waiting(e._waiting_prefill)
        if e._decide:
            e._unplaced.sort(key=reveal_order)
            e._trigger(Stage.PREFILL)
        if e._eager_fallback:
            for c in sorted(calls, key=reveal_order):
                self._place_fallback(c)


def reveal_order(call: Call) -> int:
    return call.reveal_seq


def sort_waiting(waiting: dict) -> None:
    """Restore reveal order (the engine's windows read the oldest waiting calls first)."""
    items = sorted(waiting.items(), key=lambda kv: kv[1].reveal_seq)
    waiting.clear()
    waiting.update(items)


def _reset(c: Call, e: Any) -> None:
    """A call back at waiting-prefill, unplaced, as when it was revealed (its counters stay)."""
    c.state = _WP
    c.prefill_inst = c.decode_inst = -1
    c.queue_key = UNPLANNED + c.reveal_seq
    c.prefill_start = c.prefill_end = c.transfer_end = c.decode_start = -1.0
    c.hit = c.held = 0
    c.cached = c.view_levels = None
    c.pf_est = c.pf_cold
    c.generated = 0.0
    c.preempted = 0
    c.moved = False
    c.wait_since = -1.0
    if c.width == 1 and c.lead is None:  # a preemption may have raised its reservation
        c.kv_res = c.kv_free = c.kv_true if e.decode_admission == "true-demand" else c.kv_pred
    e._seg_start.pop(c.uid, None)


def _split(c: Call, e: Any) -> None:
    """Make a sample-group member a call of its own (its group was cut by a failure)."""
    c.lead = None
    c.width = 1
    c.group_left = 0
    c.kv_true = c.l_in + c.l_out
    c.kv_pred = c.l_in + c.l_out_pred
    c.ctx_share = c.l_in + 0.5 * c.l_out_pred
    c.dec_weight = None  # its projection constants change with its demand


def _reset_decode(inst: Any) -> None:
    """A failed decode instance holds nothing; stale finish and preemption events are ignored
    (the version moves on)."""
    inst.batch = []
    inst.waiting = []
    inst.inbound = {}
    inst.queued = {}
    inst.recomputing = {}
    inst.used_kv = 0
    inst.true_base = inst.ctx_sum = inst.v = inst.step = 0.0
    inst.hold = False
    inst.version += 1
