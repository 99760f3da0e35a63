"""The decision seam between the simulator core and scheduling policies (docs/simulator.md).

At a scheduling invocation the core exposes a :class:`DecisionPoint`: the stage, the waiting
calls (the window) and the planner's simulated state Ŝ with its projections Δ(c, p, d). A policy
answers one pick at a time; each pick updates Ŝ and the projections of the calls still waiting.
The pick order is the plan's rank. When every call is picked the simulator applies the plan.
"""

from __future__ import annotations

import math
from enum import IntEnum
from typing import TYPE_CHECKING

import numpy as np

from hexagent_gym.planning import kernels
from hexagent_gym.planning.call_batch import CallBatch

if TYPE_CHECKING:
    from hexagent_gym.planning.entities import Call
    from hexagent_gym.planning.plan_state import PlanState


_WINDOW_AT_ONCE = 16  # best_pair projects the whole window up to this size, else one row
_SCALAR_WORK = 48  # waiting calls × decode instances up to which picks run in scalar Python
_SCALAR_CALLS_COMPILED = 16  # waiting calls up to which compiled scalar prefill picks run


class Stage(IntEnum):
    """Which queue a decision plans."""

    PREFILL = 0  # waiting-prefill calls: choose (p, d) and prefill queue rank
    DECODE = 1  # transferred calls at their decode instance: choose queue rank (and, for a call
    # its instance has not served yet, possibly another decode instance)


# Enum members as module constants: CPython 3.11 reads `Stage.X` through EnumType's slow
# attribute hook (about 80 ns each), and a pick reads several.
_STAGE_PREFILL = Stage.PREFILL
_STAGE_DECODE = Stage.DECODE


class DecisionPoint:
    """One scheduling invocation: pick every call of the window once, in priority order.

    Attributes:
        stage: :class:`Stage` of this invocation.
        now: simulated time (s).
        calls: the window of waiting calls (oldest first); indices into it are the "slots".
        state: Ŝ, the planner's simulated state (updated by each pick).
        plan: picks so far as ``(call, p, d, delta_s)`` in rank order.
    """

    __slots__ = ("stage", "now", "calls", "state", "plan", "picked", "_delta", "_remaining",
                 "wall_start", "_batch", "_cache_aware", "_reduced", "_min", "_last", "_pairs",
                 "_kin", "_ahead", "_ahead_from")

    def __init__(self, stage: Stage, now: float, calls: list[Call], state: PlanState,
                 wall_start: float = 0.0) -> None:
        self.stage = stage
        self.now = now
        self.calls = calls
        self.state = state
        self.plan: list[tuple[Call, int, int, float]] = []
        self.picked = [False] * len(calls)
        self._delta: np.ndarray | None = None
        self._reduced: np.ndarray | None = None  # Δ over prefill classes (n, K, D) or rows (n, D)
        self._min: np.ndarray | None = None
        self._last: tuple[int, int, int, float] | None = None  # last best_pair under this Ŝ
        self._pairs: dict[int, tuple[int, int, float]] = {}  # scalar best pairs under this Ŝ
        self._kin: tuple | None = None  # the compiled kernels' per-call inputs (and tables)
        # picks computed ahead by risk_plan, from pick number _ahead_from on (their Δ is exact)
        self._ahead: list[tuple[int, int, int, float]] = []
        self._ahead_from = 0
        self._remaining = len(calls)
        self.wall_start = wall_start
        self._batch: CallBatch | None = None
        self._cache_aware = True

    @property
    def batch(self) -> CallBatch:
        """The window's constant per-call arrays (built on first use)."""
        if self._batch is None:
            self._batch = CallBatch(self.state.tables, self.calls, self._cache_aware)
        return self._batch

    @property
    def cached(self) -> np.ndarray:
        """Prompt tokens (n, P) of each waiting call found in each prefill instance's prefix cache
        at this decision (zeros at the decode stage or without a cache)."""
        return self.batch.cached

    def ignore_cache(self) -> None:
        """Project prefill times as if no prompt were cached (a cache-oblivious planner).

        Call it before the first projection or pick of this decision.

        Raises:
            RuntimeError: projections were already built from the cache-aware view.
        """
        if (self.plan or self._pairs or self._last is not None
                or any(x is not None for x in (self._batch, self._delta, self._reduced,
                                               self._min, self._kin))):
            raise RuntimeError("ignore_cache() must come before the decision's first projection "
                               "or pick")
        self._cache_aware = False

    @property
    def done(self) -> bool:
        """True once every call in the window has been picked."""
        return self._remaining == 0

    @property
    def remaining(self) -> list[int]:
        """Slots not picked yet, oldest first."""
        return [i for i, p in enumerate(self.picked) if not p]

    @property
    def num_remaining(self) -> int:
        """How many slots are not picked yet."""
        return self._remaining

    @property
    def num_prefill(self) -> int:
        return self.state.tables.num_prefill

    @property
    def num_decode(self) -> int:
        return self.state.tables.num_decode

    @property
    def delta(self) -> np.ndarray:
        """Projected completion offsets Δ (n, P, D) in seconds from ``now`` under the current Ŝ.

        Infeasible pairs and already-picked slots are ``inf``. At the decode stage only each call's
        locked (p, d) is finite. Recomputed lazily after every pick.
        """
        if self._delta is None:
            if self.stage == _STAGE_DECODE and self._scalar_window():
                delta = self._scalar_decode_delta()
            elif self.stage == _STAGE_PREFILL and kernels.prefill_grid is not None:
                delta = self.state.tables.inf_grid(len(self.calls))
                self.state.prefill_grid(self._kernel_inputs(), self.remaining, delta)
            elif self.stage == _STAGE_PREFILL and self._remaining == 1:  # one row, no CallBatch
                slot = self.picked.index(False)
                call = self.calls[slot]
                delta = self.state.tables.inf_grid(len(self.calls))
                delta[slot] = self.state.prefill_delta_one(call, self._pf(call))
            else:
                if self.stage == _STAGE_PREFILL:
                    delta = self.state.project_prefill(self.batch)
                else:
                    delta = self.state.project_decode(self.batch)
                if self._remaining < len(self.calls):
                    delta[np.asarray(self.picked)] = np.inf
            self._delta = delta
        return self._delta

    def _scalar_decode_delta(self) -> np.ndarray:
        """:attr:`delta` at the decode stage, row by row in scalar Python without the window's
        :class:`CallBatch` (the same floats as :meth:`PlanState.project_decode`): each call has
        one row that can be finite, its prefill instance's. (At the prefill stage every entry can
        be finite and numpy's projection is faster from one call up, measured on hetero-1.)

        With the kernels built, the calls no decode limit binds (the common case: they start now
        on their own instance, so they do not move) get their one finite cell from
        ``kernels.decode_cells``; the others take :meth:`Projections.decode_delta_one`."""
        state = self.state
        delta = state.tables.inf_grid(len(self.calls))
        kernel = kernels.decode_cells
        if kernel is None:
            for i, call in enumerate(self.calls):
                if not self.picked[i]:
                    delta[i, call.prefill_inst] = state.decode_delta_one(call)
            return delta
        slots, rows, cols, weights, owns = [], [], [], [], []
        for i, call in enumerate(self.calls):
            if self.picked[i]:
                continue
            weight, own_ctx, _, free_start = state._decode_inputs(call)
            if not free_start:  # a limit may bind: the scalar rule, moves included
                delta[i, call.prefill_inst] = state.decode_delta_one(call)
            else:
                slots.append(i)
                rows.append(call.prefill_inst)
                cols.append(call.decode_inst)
                weights.append(weight)
                owns.append(own_ctx)
        if slots:
            t = state.tables
            kernel(delta, slots, rows, cols, weights, owns, state.now, state.dec_count_l,
                   state.dec_ctx_l, t.dec_static, t.batch_top)
        return delta

    @property
    def min_delta(self) -> np.ndarray:
        """Smallest Δ of each slot over its valid pairs (n,), ``inf`` once picked: equal, bit for
        bit, to ``delta.reshape(n, -1).min(axis=1)`` at O(n·(K + D)) instead of O(n·P·D) (K:
        prefill classes). Recomputed lazily after every pick."""
        if self._min is None:
            if self._delta is not None:
                self._min = self._delta.reshape(len(self.calls), -1).min(axis=1)
            elif self._scalar_window():
                self._min = np.array(self.min_delta_values())
            else:
                reduced = self._reduced_delta()
                best = reduced.reshape(len(self.calls), -1).min(axis=1)
                if self._remaining < len(self.calls):
                    best[np.asarray(self.picked)] = np.inf
                self._min = best
        return self._min

    def min_delta_values(self) -> list[float]:
        """:attr:`min_delta` as a list of Python floats (the same values), computed without
        numpy at the prefill stage with the kernels built (any window: ≈ 5× faster than numpy's
        reduction for 33 calls on hetero-1, and Ŝ then keeps no numpy twins that later commits
        update) or when the window takes the scalar path (cheaper for a policy that ranks in
        Python); kept until the next pick."""
        compiled = self.stage == _STAGE_PREFILL and kernels.best_prefill_pairs is not None
        if self._min is not None or self._delta is not None or not (
                compiled or self._scalar_window()):
            return self.min_delta.tolist()
        if compiled:
            self._compiled_pairs()  # every unpicked slot's pair in one compiled call
        inf = np.inf
        return [self._scalar_pair(i)[2] if not picked else inf
                for i, picked in enumerate(self.picked)]

    def best_pair(self, slot: int) -> tuple[int, int, float]:
        """The valid pair with the smallest Δ for ``slot`` and that Δ (seconds from now).

        Ties resolve as ``np.argmin`` over the slot's (P, D) row: lowest prefill index, then
        lowest decode index; a slot without a valid pair gives (0, 0, inf). Costs O(K·D) plus
        O(P) per decode instance tied for the minimum, never the full (P, D) row."""
        if self._delta is not None:
            row = self._delta[slot]
            flat = int(np.argmin(row))
            p, d = divmod(flat, row.shape[1])
            return p, d, float(row.flat[flat])
        if self._reduced is None and (self._remaining == 1 or self._scalar_window() or (
                self.stage == _STAGE_PREFILL and kernels.best_prefill_pairs is not None)):
            # one row of a long prefill window (a one-pass ordering picks slot by slot): the
            # compiled one-call rule, the same pair and float as the numpy row at a fraction
            # of its cost (which dominated overloaded episodes' picks, docs/overload.md)
            pair = self._scalar_pair(slot)
            self._last = (slot, *pair)
            return pair
        if self._reduced is not None or len(self.calls) <= _WINDOW_AT_ONCE:
            reduced, batch, i = self._reduced_delta(), self.batch, slot
        else:  # a long window picked one slot at a time: project only this row
            batch, i = self.batch.row(slot), 0
            reduced = (self.state.project_prefill_classes(batch) if self.stage == _STAGE_PREFILL
                       else self.state.project_decode_rows(batch))
        if self.stage == _STAGE_DECODE:
            row = reduced[i]
            d = int(np.argmin(row))
            best = float(row[d])
            pair = (0, 0, best) if best == np.inf else (int(batch.prefill_inst[i]), d, best)
        else:
            pair = self.state.best_prefill_pair(batch, i, reduced[i])
        self._last = (slot, *pair)
        return pair

    def _scalar_window(self) -> bool:
        """Whether per-call scalar code beats the vectorised projection for this window:
        one call at any size, or a few calls on a small cluster (numpy's fixed cost per
        operation dominates there; measured on hetero-1); at the prefill stage with the
        compiled one-call rule (:mod:`hexagent_gym.planning.kernels`), up to
        ``_SCALAR_CALLS_COMPILED`` calls on any cluster."""
        if self.stage == _STAGE_PREFILL and kernels.best_prefill_pairs is not None:
            return self._remaining <= _SCALAR_CALLS_COMPILED
        return self._remaining * self.num_decode <= _SCALAR_WORK

    def _scalar_pair(self, slot: int) -> tuple[int, int, float]:
        """:meth:`best_pair` of one slot in scalar code, kept until the next pick."""
        pair = self._pairs.get(slot)
        if pair is None:
            call = self.calls[slot]
            if self.stage == _STAGE_PREFILL:
                if kernels.best_prefill_pairs is not None:
                    (pair,) = self.state.best_prefill_pairs(self._kernel_inputs(), [slot])
                else:
                    pair = self.state.best_prefill_pair_one(call, self._pf(call))
            else:
                pair = self.state.best_decode_pair_one(call)
            self._pairs[slot] = pair
        return pair

    def risk_plan(self, horizons: list[float] | None = None) -> list[tuple[int, int, int, float]]:
        """The compiled twin of ``hexagent_gym.agents.hexagent``'s ranking from the current Ŝ on:
        the picks ``(slot, p, d, Δ)`` that projected-risk greedy with best-pair placement makes,
        each committed to a copy of Ŝ, as far as the twin computes them exactly (it stops where a
        decode limit binds, a slot has no valid pair, or a risk is undefined; possibly at once).
        ``horizons``: the risk's denominator per slot (default: each workflow's running horizon
        ``h_est``, the paper's rule). Prefill stage with the kernels built only, else ``[]``.
        Nothing is picked: :meth:`pick` then finds each Δ without projecting."""
        if self.stage != _STAGE_PREFILL or kernels.risk_plan is None or not self._remaining:
            return []
        state, calls = self.state, self.calls
        t = state.tables
        limits = state.kernel_limits()
        plan = kernels.risk_plan(
            state.now, state.free_l, t.pf_members, t.pf_class_list, t.dec_kind,
            state.dec_count_l, state.dec_ctx_l, state.dec_tokens_l, t.dec_static, t.batch_top,
            t.dec_capacity, *self._kernel_inputs(),
            [c.ctx_share for c in calls], [c.workflow.arrival for c in calls],
            horizons or [c.workflow.h_est for c in calls], limits[0], limits[1], self.picked)
        self._ahead, self._ahead_from = plan, len(self.plan)
        return plan

    def planned_pick(self) -> tuple[int, int, int, float] | None:
        """The next pick of the last :meth:`risk_plan` while every pick since followed it, as
        ``(slot, p, d, Δ)``; None once the plan is used up or a pick left it."""
        k = len(self.plan) - self._ahead_from
        ahead = self._ahead
        return ahead[k] if k < len(ahead) else None

    def follow_plan(self) -> int:
        """Make every remaining pick of the last :meth:`risk_plan` at once, while every pick
        since followed it; return how many were made (0: none left, or a pick left the plan).

        The same picks, Δs and Ŝ as calling :meth:`pick` with each :meth:`planned_pick` in
        turn, without the per-pick checks (the plan is valid by construction, see
        :meth:`pick`): a policy that follows its computed ranking answers a decision in one
        call (``hexagent_gym.agents.hexagent``'s ``decide``)."""
        ahead = self._ahead
        k = len(self.plan) - self._ahead_from
        if k >= len(ahead):
            return 0
        rest = ahead[k:]
        self._record_planned(rest)
        return len(rest)

    def pick_in_order(self, slots: list[int]) -> int:
        """Pick each of ``slots`` in turn at its best pair under the Ŝ the picks before it left
        (a one-pass ordering): the same picks, Δs and Ŝ as ``pick(slot, *best_pair(slot)[:2])``
        one by one, stopping before a slot already picked or without a valid pair (``pick``
        raises there); return how many were made. At the prefill stage with the kernels built,
        one loop of compiled best pairs and commits: a long window's per-pick Python calls
        dominated overloaded episodes (docs/overload.md)."""
        made = 0
        picked = self.picked
        if self.stage != _STAGE_PREFILL or kernels.best_prefill_pairs is None:
            for slot in slots:
                if picked[slot]:
                    break
                p, d, value = self.best_pair(slot)
                if value == np.inf:
                    break
                self.pick(slot, p, d)
                made += 1
            return made
        state, calls, plan = self.state, self.calls, self.plan
        inputs, cache_aware, commit = self._kernel_inputs(), self._cache_aware, state.commit
        best_pairs = state.best_prefill_pairs
        for slot in slots:
            if picked[slot]:
                break
            ((p, d, value),) = best_pairs(inputs, [slot])
            if value == np.inf:
                break
            call = calls[slot]
            commit(call, p, d, value, True, (call.pf_est if cache_aware else call.pf_cold)[p])
            plan.append((call, p, d, value))
            picked[slot] = True
            made += 1
        if made:
            self._remaining -= made
            self._ahead = []  # as pick: a computed plan is stale after picks off it
            self._state_moved()
        return made

    def _record_planned(self, rest: list[tuple[int, int, int, float]]) -> None:
        """Commit picks ``(slot, p, d, Δ)`` of the computed plan (valid by construction) to Ŝ
        in one loop, record them and drop what Ŝ's move made stale. The first takes Δ's entry
        when the tensor is built (as :meth:`pick` does); each commit moves Ŝ, so later ones
        take the plan's exact Δ."""
        calls, picked = self.calls, self.picked
        picks = [(calls[slot], p, d, value) for slot, p, d, value in rest]
        delta = self._delta
        if delta is not None:
            slot, p, d, _ = rest[0]
            picks[0] = (calls[slot], p, d, delta.item(slot, p, d))
        self.state.commit_prefill_picks(picks, self._cache_aware)
        self.plan.extend(picks)
        for slot, _, _, _ in rest:
            picked[slot] = True
        self._remaining -= len(rest)
        self._state_moved()

    def _state_moved(self) -> None:
        """Drop what a commit made stale: Δ and its reductions are recomputed lazily from Ŝ
        (updating only the slices Δ[:, p, :] and Δ[:, :, d] in place was measured slower than
        the full vectorised recompute up to 32 calls on 8 + 8)."""
        self._delta = self._reduced = self._min = self._last = None
        if self._pairs:
            self._pairs = {}

    def _compiled_pairs(self) -> None:
        """Fill :meth:`_scalar_pair`'s cache for every unpicked slot in one compiled call."""
        pairs = self._pairs
        missing = [i for i, picked in enumerate(self.picked) if not picked and i not in pairs]
        if missing:
            for i, pair in zip(missing, self.state.best_prefill_pairs(self._kernel_inputs(),
                                                                      missing), strict=True):
                pairs[i] = pair

    def _kernel_inputs(self) -> tuple:
        """The window's per-call inputs of :meth:`PlanState.best_prefill_pairs`, built once:
        the prefill seconds, the prompt lengths (the kernels compute the transfer seconds from
        them and the tables' ``transfer_tables``, the next entry), then the decode inputs."""
        if self._kin is None:
            state = self.state
            constants = state.call_constants
            cache_aware = self._cache_aware
            pfs, lens, weights, own_ctxs, kvs, kv_trues = ([], [], [], [], [], [])
            for c in self.calls:  # one loop, not six comprehensions (each a frame in 3.11)
                pfs.append(c.pf_est if cache_aware else c.pf_cold)  # self._pf(c)
                lens.append(c.l_in)
                if c.dec_weight is None:  # kept on the call after its first projection
                    constants(c)
                weights.append(c.dec_weight)
                own_ctxs.append(c.own_ctx)
                kvs.append(c.kv_demand)
                kv_trues.append(c.kv_true)
            self._kin = (pfs, lens, state.tables.transfer_tables, weights, own_ctxs, kvs,
                         kv_trues)
        return self._kin

    def _pf(self, call: Call) -> list[float]:
        """The prefill seconds this decision projects for ``call`` on each instance."""
        return call.pf_est if self._cache_aware else call.pf_cold

    def _reduced_delta(self) -> np.ndarray:
        if self._reduced is None:
            if self.stage == _STAGE_PREFILL:
                self._reduced = self.state.project_prefill_classes(self.batch)
            else:
                self._reduced = self.state.project_decode_rows(self.batch)
        return self._reduced

    def delta_row(self, slot: int) -> np.ndarray:
        """Δ (P, D) of one slot, without computing the whole tensor (for one-pass orderings)."""
        if self._delta is not None:
            return self._delta[slot]
        if self.stage == _STAGE_PREFILL:
            call = self.calls[slot]
            return self.state.prefill_delta_one(call, self._pf(call))
        return self.state.project_decode(self.batch.row(slot))[0]

    def _delta_at(self, slot: int, p: int, d: int) -> float:
        """Δ of one (slot, p, d) under the current Ŝ (one entry, not the row)."""
        if self._delta is not None:
            return float(self._delta[slot, p, d])
        planned = self.planned_pick()
        if planned is not None and planned[:3] == (slot, p, d):
            return planned[3]
        last = self._last
        if last is not None and last[:3] == (slot, p, d):
            return last[3]
        call = self.calls[slot]
        if self.stage == _STAGE_PREFILL:  # scalar: the same float as the numpy projection
            return self.state.prefill_delta_at_one(call, self._pf(call), p, d)
        if p != call.prefill_inst:
            return np.inf
        return self.state.decode_delta_one(call)[d]

    def feasible(self, slot: int) -> np.ndarray:
        """Boolean (P, D) mask of valid placements for a slot (all False once it is picked)."""
        if self.picked[slot]:
            return np.zeros((self.num_prefill, self.num_decode), dtype=bool)
        return np.isfinite(self.delta_row(slot))

    def pick(self, slot: int, p: int, d: int) -> None:
        """Record the next-ranked call and its placement, then update Ŝ.

        Raises:
            ValueError: the slot is out of range or already picked, or (p, d) is not a valid
                placement for it (out of range, cannot hold its KV, or not its locked pair).
        """
        calls = self.calls
        ahead = self._ahead
        planned = self.planned_pick() if ahead else None
        if planned is not None and planned[0] == slot and planned[1] == p and planned[2] == d:
            # the plan's next pick, valid by construction (risk_plan emits unpicked prefill-stage
            # slots with a finite Δ on the cluster's instances): the commit below without checks
            self._record_planned([planned])
            return
        n = len(calls)
        if not 0 <= slot < n:
            raise ValueError(f"call slot {slot} is out of range: this decision has {n} calls "
                             f"(slots 0..{n - 1})")
        picked = self.picked
        if picked[slot]:
            raise ValueError(f"call slot {slot} was already picked at this decision; "
                             f"unpicked slots: {self.remaining}")
        state = self.state
        tables = state.tables
        P, D = tables.num_prefill, tables.num_decode
        if not (0 <= p < P and 0 <= d < D):
            raise ValueError(f"placement (p={p}, d={d}) is out of range: the cluster has {P} "
                             f"prefill and {D} decode instances")
        call = calls[slot]
        prefill = self.stage == _STAGE_PREFILL
        if not prefill and (p, d) != (call.prefill_inst, call.decode_inst):
            if not state.free_decode or self.batch.locked[slot]:
                raise ValueError(f"call slot {slot} is locked to (p={call.prefill_inst}, "
                                 f"d={call.decode_inst}) at the decode stage, got (p={p}, d={d})")
            if p != call.prefill_inst:
                raise ValueError(f"call slot {slot} may move to another decode instance but its "
                                 f"KV comes from prefill instance {call.prefill_inst}, got p={p}")
        delta = self._delta
        value = delta.item(slot, p, d) if delta is not None else self._delta_at(slot, p, d)
        if not math.isfinite(value):  # a float: math's test, not numpy's scalar machinery
            if not prefill and d != call.decode_inst:
                raise ValueError(f"call slot {slot} cannot move to decode instance {d} now: a "
                                 f"free call moves only when its instance {call.decode_inst} "
                                 f"cannot admit it, to an instance that can hold it; "
                                 f"feasible(slot) shows where")
            cap = tables.capacity[d]
            raise ValueError(f"call slot {slot} needs {call.kv_true} KV tokens but decode "
                             f"instance {d} holds at most {int(cap)}; choose a d where "
                             f"feasible(slot) is True")
        if prefill:
            pf = (call.pf_est if self._cache_aware else call.pf_cold)[p]  # self._pf(call)[p]
            state.commit(call, p, d, value, True, pf)
        else:
            state.commit(call, p, d, value, False, None)
        if ahead:  # a pick off the computed plan (a following one returned above) makes the
            self._ahead = []  # rest of it stale
        self.plan.append((call, p, d, value))
        picked[slot] = True
        self._remaining -= 1
        self._state_moved()


def earliest_finish_pick(dp: DecisionPoint) -> tuple[int, int, int]:
    """The core's fallback as a policy: the oldest unpicked call (FIFO) at its earliest
    projected finish (ties: lowest decode index, then earliest KV arrival, then lowest prefill
    index). It places exactly as the simulator's fallback does without decision points."""
    slot = dp.picked.index(False)
    call = dp.calls[slot]
    if dp.stage == _STAGE_DECODE:
        return slot, call.prefill_inst, call.decode_inst
    p, d, _ = dp.state.earliest_pair(call)
    return slot, p, d
