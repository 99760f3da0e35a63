"""What instance faults do to a running episode (the semantics: docs/faults.md; the
configuration: :mod:`hexagent_gym.sim.faults`; what a failure or a drain does to the work on an
instance: :mod:`hexagent_gym.sim.fault_loss`).

:class:`FaultFlow` is built by the :class:`~hexagent_gym.sim.engine.Engine` only when the episode
has faults. It pushes ``Phase.FAULT`` events and, for the episode's duration, replaces four of the
engine's methods *on the engine instance* (``_open_decision``, ``_apply``, ``_place_fallback`` and,
while a prefill instance is slowed, ``_start_prefill``): an episode without faults runs the
class's methods untouched, with no per-event test at all.

Unavailable instances (failed or drained) never reach a policy: each decision's Ŝ is patched
before the policy sees it (an unavailable prefill instance is never free, ``free = inf``; an
unavailable decode instance has a full batch, ``dec_count += DOWN``), so every Δ through one is
inf and the feasibility mask, ``best_pair``, ``min_delta``, the compiled kernels and the env's
mask all leave it out. Picking one anyway is a ``ValueError`` naming it. A waiting call that no
available pair can serve (no prefill or no decode instance up, or none that holds its KV) is
*parked*: left out of windows and the fallback until an instance returns.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Any

from hexagent_gym.planning.decisions import DecisionPoint, Stage
from hexagent_gym.planning.entities import CallState, prefill_free_times
from hexagent_gym.planning.placement import earliest_pair
from hexagent_gym.planning.plan_state import snapshot
from hexagent_gym.sim.events import Phase
from hexagent_gym.sim.fault_loss import FaultLoss, reveal_order, sort_waiting
from hexagent_gym.sim.faults import FaultPlan, draw_fault, instance_rng, parse_faults

if TYPE_CHECKING:
    from hexagent_gym.planning.entities import Call

DOWN = 1 << 30
"""Added to an unavailable decode instance's committed-call count in Ŝ: its batch is full for
good, so its earliest start (and every Δ on it) is inf in every projection path."""
_INF = math.inf
_WP = CallState.WAITING_PREFILL


class FaultDecisionPoint(DecisionPoint):
    """A decision point while some instance is unavailable: :meth:`pick` names the instance
    instead of pricing it (the unavailable sets are on ``state.fault_down``)."""

    __slots__ = ()

    def pick(self, slot: int, p: int, d: int) -> None:
        down_p, down_d = self.state.fault_down
        if 0 <= slot < len(self.calls) and self.stage == Stage.PREFILL and p in down_p:
            raise ValueError(f"prefill instance {p} is unavailable (failed or drained) at "
                             f"t={self.now:g}; choose a p where feasible(slot) is True")
        if 0 <= slot < len(self.calls) and d in down_d and (
                self.stage == Stage.PREFILL or d != self.calls[slot].decode_inst):
            raise ValueError(f"decode instance {d} is unavailable (failed or drained) at "
                             f"t={self.now:g}; choose a d where feasible(slot) is True")
        super().pick(slot, p, d)


class ScaledLatency:
    """A latency model running at ``speed`` times its base speed (a straggler): step and
    recompute times divided by ``speed``; everything else is the base model's."""

    def __init__(self, base: Any, speed: float) -> None:
        self.base, self.speed = base, speed

    def decode_step_time(self, batch: int, ctx: float) -> float:
        return self.base.decode_step_time(batch, ctx) / self.speed

    def prefill_time(self, n: int, cached: int = 0) -> float:
        return self.base.prefill_time(n, cached) / self.speed

    def __getattr__(self, name: str) -> Any:
        if name == "base" or name.startswith("__"):  # copies and pickles build it bare first
            raise AttributeError(name)
        return getattr(self.base, name)


class FaultFlow(FaultLoss):
    """The fault events of one episode and their effect on its engine (one per engine)."""

    def __init__(self, engine: Any, plan: FaultPlan, seed: int) -> None:
        self.e = engine
        sizes = {"prefill": len(engine.prefill), "decode": len(engine.decode)}
        self.failed = {pool: [0] * n for pool, n in sizes.items()}  # active fail faults
        self.drained = {pool: [0] * n for pool, n in sizes.items()}  # active drain faults
        self.slow = {pool: [[] for _ in range(n)] for pool, n in sizes.items()}  # factors
        self.base_latency = [inst.latency for inst in engine.decode]
        self.down_p: set[int] = set()
        self.down_d: set[int] = set()
        self.parked: list[Call] = []  # waiting calls no available pair can serve now
        self.future = True  # False in a scheduler's fork: no new fault is drawn or started
        self.events = self.reexecuted = self.replaced = 0
        self.recomputed_tokens = 0.0
        self.process = plan.process
        self.rngs = {}
        push = engine.events.push
        for ev in plan.events:
            push(ev.time, Phase.FAULT, ("start", ev.pool, ev.index, ev.kind, ev.duration,
                                        ev.factor))
        if plan.process is not None:
            for pool in plan.process.pools:
                for i in range(sizes[pool]):
                    rng = self.rngs[pool, i] = instance_rng(seed, pool, i)
                    push(plan.process.start + float(rng.exponential(plan.process.mtbf)),
                         Phase.FAULT, ("draw", pool, i))
        engine._handlers[Phase.FAULT] = self.on_event
        engine._open_decision = self._open_decision
        engine._apply = self._apply
        engine._place_fallback = self._place_fallback

    @classmethod
    def build(cls, engine: Any, faults: Any, seed: int) -> FaultFlow | None:
        """The engine's fault flow for ``faults`` (a :class:`FaultPlan`, its mapping form or
        None) drawn from ``seed``; None when there is no fault.

        Raises:
            ConfigError: an invalid setting, or an event on an instance the cluster lacks."""
        plan = parse_faults(faults)
        if plan is None:
            return None
        plan.check_cluster(len(engine.prefill), len(engine.decode), "faults")
        return cls(engine, plan, seed)

    def counters(self) -> dict[str, Any]:
        """The episode's fault counters (``EpisodeResult``'s ``fault_*`` fields)."""
        return {"fault_events": self.events, "fault_reexecuted_calls": self.reexecuted,
                "fault_recomputed_tokens": self.recomputed_tokens,
                "fault_replaced_calls": self.replaced}

    def detach(self) -> None:
        """Drop the engine's overrides and the back-reference (``Engine.close``: no reference
        cycle is left for the collector); returns None."""
        for name in ("_open_decision", "_apply", "_place_fallback", "_start_prefill"):
            self.e.__dict__.pop(name, None)
        self.e = None

    def forget_future(self) -> None:
        """What a scheduler knows (``fork.known_only``): faults in progress and their ends, no
        fault yet to start."""
        self.future = False
        heap = self.e.events.heap
        heap[:] = [ev for ev in heap if ev[1] != Phase.FAULT or ev[3][0] == "end"]
        heapq.heapify(heap)

    # -- events ---------------------------------------------------------------------------------
    def on_event(self, payload: tuple) -> None:
        e = self.e
        if e.done or (not self.future and payload[0] != "end"):
            return  # the episode is over: faults no longer matter (and the clock can stop)
        if payload[0] == "draw":
            _, pool, i = payload
            proc = self.process
            kind, duration, up = draw_fault(self.rngs[pool, i], proc)
            e.events.push(e.now + duration + up, Phase.FAULT, ("draw", pool, i))
            self._start(pool, i, kind, duration, proc.slow_factor if kind == "slow" else 1.0)
        elif payload[0] == "start":
            self._start(*payload[1:])
        else:
            self._end(*payload[1:])

    def _start(self, pool: str, i: int, kind: str, duration: float, factor: float) -> None:
        self.events += 1
        self.e.events.push(self.e.now + duration, Phase.FAULT, ("end", pool, i, kind, factor))
        if kind == "slow":
            old = self._speed(pool, i)
            self.slow[pool][i].append(factor)
            self._respeed(pool, i, old)
            return
        counts = self.failed if kind == "fail" else self.drained
        counts[pool][i] += 1
        (self.down_p if pool == "prefill" else self.down_d).add(i)
        if kind == "fail" and counts[pool][i] == 1:
            self._fail(pool, i)
        elif kind == "drain" and counts[pool][i] == 1:
            self._drain(pool, i)

    def _end(self, pool: str, i: int, kind: str, factor: float) -> None:
        if kind == "slow":
            old = self._speed(pool, i)
            self.slow[pool][i].remove(factor)
            self._respeed(pool, i, old)
            return
        (self.failed if kind == "fail" else self.drained)[pool][i] -= 1
        if self.failed[pool][i] == 0 and self.drained[pool][i] == 0:
            (self.down_p if pool == "prefill" else self.down_d).discard(i)
            self._unpark()

    # -- availability ---------------------------------------------------------------------------
    def _blocked(self, call: Call) -> bool:
        """No available (p, d) pair can serve ``call`` now."""
        e = self.e
        if len(self.down_p) == len(e.prefill):
            return True
        cap = e.tables.dec_capacity
        return all(d in self.down_d or call.kv_true > cap[d] for d in range(len(e.decode)))

    def _park(self, call: Call) -> None:
        if call not in self.parked:
            self.parked.append(call)

    def _unpark(self) -> None:
        """An instance returned: parked calls get another chance, and the prefill stage is
        re-planned so that waiting calls may use it."""
        e = self.e
        parked, self.parked = self.parked, []
        parked = [c for c in parked if c.state == _WP and c.prefill_inst < 0]
        if e._decide:
            known = {c.uid for c in e._unplaced}
            e._unplaced.extend(c for c in parked if c.uid not in known)
            e._unplaced.sort(key=reveal_order)
            if e._waiting_prefill:
                e._trigger(Stage.PREFILL)
        if e._eager_fallback:
            for c in parked:
                self._place_fallback(c)

    # -- the engine's overrides -------------------------------------------------------------------
    def _open_decision(self, stage: Stage) -> DecisionPoint | None:
        e = self.e
        cls = type(e)
        if not self.down_p and not self.down_d:
            return cls._open_decision(e, stage)
        prefill = stage == Stage.PREFILL
        if prefill and (len(self.down_p) == len(e.prefill) or len(self.down_d) == len(e.decode)):
            e._schedule_pushed[stage] = False  # nothing can be placed: wait for a recovery
            return None
        blocked = [c for c in e._waiting_prefill.values()
                   if c.prefill_inst < 0 and self._blocked(c)] if prefill else []
        if blocked:  # out of the window while blocked (the fallback parks them)
            waiting = e._waiting_prefill
            for c in blocked:
                del waiting[c.uid]
            try:
                dp = cls._open_decision(e, stage)
            finally:
                for c in blocked:
                    waiting[c.uid] = c
                sort_waiting(waiting)
        else:
            dp = cls._open_decision(e, stage)
        if dp is None:
            return None
        st = dp.state
        for p in self.down_p:
            if prefill:
                st.free_l[p] = _INF
                st.pf_tokens_l[p] = _INF
        drained = [d for d in self.down_d if not self.failed["decode"][d]]
        for d in self.down_d:
            if prefill or d not in drained:
                st.dec_count_l[d] += DOWN
        if not prefill and drained:
            st.free_decode = False  # calls waiting at a drained instance stay; no move to one
        st.fault_down = (frozenset(self.down_p) if prefill else frozenset(),
                         frozenset(self.down_d))
        dp.__class__ = FaultDecisionPoint
        return dp

    def _apply(self, stage: Stage, plan: list, origin: float) -> None:
        """A late plan (made before a fault) drops its placements on unavailable instances; the
        calls it leaves keep their place or are placed by the fallback."""
        if self.down_p or self.down_d:
            down_p, down_d = self.down_p, self.down_d
            if stage == Stage.PREFILL:
                plan = [x for x in plan if x[1] not in down_p and x[2] not in down_d]
            else:
                plan = [x for x in plan if x[2] == x[0].decode_inst or x[2] not in down_d]
        type(self.e)._apply(self.e, stage, plan, origin)

    def _place_fallback(self, call: Call) -> None:
        """The fallback placement over available instances only; parks a blocked call."""
        e = self.e
        if not self.down_p and not self.down_d:
            type(e)._place_fallback(e, call)
            return
        if self._blocked(call):
            self._park(call)
            return
        now, loads = e.now, e.loads
        e._view(call)
        free = prefill_free_times(loads.pf_run_end, now, loads.pf_queued)
        for p in self.down_p:
            free[p] = _INF
        count = loads.dec_count[:]
        for d in self.down_d:
            count[d] += DOWN

        def slow_start(d: int, need: float, over: int) -> float:
            return snapshot(e.tables, now, loads, e.decode, [call], True).slow_start(d, need,
                                                                                     over)

        p, d, delta = earliest_pair(e.tables, now, free, loads.dec_pred, count, loads.dec_ctx,
                                    call, slow_start)
        call.proj_release = now + delta
        e._enqueue_prefill(call, p, d)

    def _start_prefill_slowed(self, inst: Any, call: Call) -> None:
        """``_start_prefill``, then the true prefill time divided by the instance's speed."""
        e = self.e
        type(e)._start_prefill(e, inst, call)
        speed = self._speed("prefill", inst.index)
        if speed != 1.0:
            self._retime(lambda ev: ev[1] == Phase.PREFILL_DONE and ev[3] == inst.index,
                         1.0 / speed)

    # -- stragglers -------------------------------------------------------------------------------
    def _speed(self, pool: str, i: int) -> float:
        speed = 1.0
        for f in self.slow[pool][i]:
            speed *= f
        return speed

    def _retime(self, match: Any, ratio: float) -> None:
        """Stretch the remaining time of the pending events ``match`` selects by ``ratio``."""
        heap, now = self.e.events.heap, self.e.now
        heap[:] = [(now + (ev[0] - now) * ratio, *ev[1:]) if match(ev) else ev for ev in heap]
        heapq.heapify(heap)

    def _respeed(self, pool: str, i: int, old: float) -> None:
        e, new = self.e, self._speed(pool, i)
        if new == old:
            return
        if pool == "prefill":
            self._retime(lambda ev: ev[1] == Phase.PREFILL_DONE and ev[3] == i, old / new)
            slowed = any(self._speed("prefill", p) != 1.0 for p in range(len(e.prefill)))
            if slowed:
                e._start_prefill = self._start_prefill_slowed
            else:
                e.__dict__.pop("_start_prefill", None)
            return
        inst = e.decode[i]
        inst.advance(e.now)  # the batch's progress so far, at the old speed
        base = self.base_latency[i]
        inst.latency = base if new == 1.0 else ScaledLatency(base, new)
        if inst.recomputing:
            ids = set(inst.recomputing)
            self._retime(lambda ev: ev[1] == Phase.RECOMPUTE_DONE and ev[3].uid in ids,
                         old / new)
            for ev in e.events.heap:
                if ev[1] == Phase.RECOMPUTE_DONE and ev[3].uid in ids:
                    inst.recomputing[ev[3].uid] = (ev[0], ev[3])
        if inst.batch:
            e._reschedule(inst)  # new step time: the pending finish and preemption are stale


__all__ = ["DOWN", "FaultDecisionPoint", "FaultFlow", "ScaledLatency"]
