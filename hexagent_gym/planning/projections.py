"""The projections Δ(c, p, d) over the planner's simulated state Ŝ (docs/simulator.md).

Everything here is *scheduler-visible*: prefill and decode times carry the per-call estimation
error and output lengths are predicted ones. True service times live in the simulator only.

Projection of call c on pair (p, d) at time ``now``::

    pf_end  = free[p] + pf_est[c, p]
    arrive  = pf_end + setup[p, d] + L_in · s_per_token[p, d]
    start   = max(arrive, T_d(c))          # earliest capacity- and batch-feasible decode start
    Δ       = start + L_out_pred · τ_d(c) − now

``T_d`` treats every reservation on d as held from now until its projected release (a
conservative step function, so the earliest start is one search in the sorted releases), and
``τ_d`` is the per-token step time with the call added to d's committed batch, from an affine
(in context) table per batch size.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import add
from typing import TYPE_CHECKING

import numpy as np

from hexagent_gym.planning import kernels
from hexagent_gym.planning.cluster_tables import INF, mean_own_context
from hexagent_gym.planning.placement import decode_end, decode_terms

if TYPE_CHECKING:
    from hexagent_gym.planning.call_batch import CallBatch
    from hexagent_gym.planning.entities import Call


class Projections:
    """Δ of waiting calls under Ŝ: full tensors, per-class reductions and exact argmins (a mixin
    of :class:`~hexagent_gym.planning.plan_state.PlanState`, whose state it reads)."""

    def project_prefill(self, batch: CallBatch) -> np.ndarray:
        """Δ (n, P, D) for calls waiting for prefill; inf where d cannot hold the call."""
        return self._finish(batch, (self.free + batch.pf)[:, :, None] + batch.xfer)

    def project_prefill_classes(self, batch: CallBatch) -> np.ndarray:
        """Δ (n, K, D) over prefill *classes*: each class's entry is its best member's.

        Members of a class differ only in their free time and cached prefix, i.e. in
        ``free + pf``; Δ is monotone in it, so the class's entry is the minimum of
        :meth:`project_prefill` over its members (the same float, bit for bit), and the
        minimum over (K, D) is the minimum over (P, D) at O(K·D) instead of O(P·D)."""
        t = self.tables
        ready = np.minimum.reduceat((self.free + batch.pf)[:, t.pf_perm], t.pf_starts, axis=1)
        return self._finish(batch, ready[:, :, None] + batch.xfer_cls)

    def _finish(self, batch: CallBatch, arrive: np.ndarray) -> np.ndarray:
        """Δ from KV arrival times ``arrive`` (n, X, D): the later of arrival and the earliest
        decode start, plus the decode time, from now; inf where d cannot hold the call."""
        start = self.decode_starts(batch.kv_pred)
        self._start_memo = (batch, start)  # best_prefill_pair reuses it until the next commit
        if not isinstance(start, float):
            start = start[:, None, :]
        base, slope = self._tau
        dec = batch.weight[:, None] * (base[None, :] + slope[None, :] * batch.ctx[:, None])
        delta = np.maximum(arrive, start) + (dec - self.now)[:, None, :]
        if batch.any_too_big:
            delta[np.broadcast_to(batch.too_big[:, None, :], delta.shape)] = INF
        return delta

    def best_prefill_pair(self, batch: CallBatch, i: int,
                          classes: np.ndarray) -> tuple[int, int, float]:
        """The pair ``np.argmin`` picks in row ``i`` of :meth:`project_prefill` (lowest p, then
        lowest d, among equal Δ) and that Δ, from the row's class projection ``classes`` (K, D).

        Only the (class, decode) entries where the minimum occurs are expanded, in scalar
        Python, over the members of those classes (exact ties between members and classes are
        resolved as the full row would)."""
        best = float(classes.min())
        if best == INF:
            return 0, 0, best  # no valid pair: argmin of an all-inf row
        num_d = classes.shape[1]
        ties = np.flatnonzero(classes == best).tolist()  # flat (class, decode) entries at it
        cols = sorted({f % num_d for f in ties})
        t = self.tables
        memo = self._start_memo
        if memo is not None and memo[0] is batch:
            start = memo[1]
            if not isinstance(start, float):
                start = [start.item(i, d) for d in cols]
        else:
            start = self.decode_starts(batch.kv_pred[i:i + 1])
            if not isinstance(start, float):
                start = [start.item(0, d) for d in cols]
        if isinstance(start, float):
            start = [start] * len(cols)
        base, slope = self._tau
        weight, ctx, l_in, now = (batch.weight.item(i), batch.ctx.item(i), batch.l_in.item(i),
                                  self.now)
        ends = [weight * (base.item(d) + slope.item(d) * ctx) - now for d in cols]
        # Scalar Python over the members of the classes reaching the minimum (the others cannot:
        # a class's entry is its best member's), in the order np.argmin scans the row: lowest p,
        # then lowest d. The same operations as the numpy row, so the same floats.
        reach = sorted({f // num_d for f in ties})
        members = t.pf_members[reach[0]] if len(reach) == 1 else sorted(
            p for k in reach for p in t.pf_members[k])
        free, pf = self.free_l, batch.pf[i].tolist()
        setup, spt = t.setup_list, t.spt_list
        for p in members:
            f = free[p] + pf[p]
            srow, xrow = setup[p], spt[p]
            for j, d in enumerate(cols):
                a = f + (srow[d] + l_in * xrow[d])
                st = start[j]
                if (a if a > st else st) + ends[j] == best:
                    return p, d, best
        raise AssertionError("the minimum is reached by some pair")

    def best_prefill_pair_one(self, call: Call, pf: list[float]) -> tuple[int, int, float]:
        """:meth:`best_prefill_pair` for a window of one call, in scalar code (the common
        decision; numpy's per-call overhead dominates at this size). ``pf``: the prefill
        seconds the projection uses on each instance. Same floats, same tie-breaking. Runs the
        compiled twin of :meth:`best_prefill_pair_one_python` when it is built
        (:mod:`hexagent_gym.planning.kernels`)."""
        if kernels.best_prefill_pairs is None:
            return self.best_prefill_pair_one_python(call, pf)
        weight, own_ctx, kv = self.call_constants(call)
        (pair,) = self.best_prefill_pairs(([pf], [call.l_in], self.tables.transfer_tables,
                                           [weight], [own_ctx], [kv], [call.kv_true]), [0])
        return pair

    def best_prefill_pairs(self, inputs: tuple[list, ...],
                           slots: list[int]) -> list[tuple[int, int, float]]:
        """:meth:`best_prefill_pair_one` of the window's calls ``slots`` in one compiled call
        (only with :mod:`hexagent_gym.planning.kernels` built). ``inputs``: the window's per-call
        lists (prefill seconds per instance; prompt lengths, or transfer columns as rows; then the
        tables' ``transfer_tables``, or None when every call has rows; then
        :meth:`call_constants` as three lists; then true KV demands), constant over the
        decision."""
        t = self.tables
        limits = self.kernel_limits()
        return kernels.best_prefill_pairs(
            self.now, self.free_l, t.pf_members, t.pf_class_list, self.decode_scan(),
            self.dec_count_l, self.dec_ctx_l, self.dec_tokens_l, t.dec_static, t.batch_top,
            t.dec_capacity, self.slow_start, *inputs, limits[0], limits[1], slots)

    def prefill_grid(self, inputs: tuple[list, ...], slots: list[int],
                     out: np.ndarray) -> None:
        """:meth:`prefill_delta_one` of the window's calls ``slots`` written into ``out[i]``
        (float64, (n, P, D), C-contiguous) in one compiled call (only with
        :mod:`hexagent_gym.planning.kernels` built); the other rows are left as they are.
        ``inputs``: as
        :meth:`best_prefill_pairs`'."""
        t = self.tables
        limits = self.kernel_limits()
        kernels.prefill_grid(
            self.now, self.free_l, t.pf_members, t.pf_class_list, (), self.dec_count_l,
            self.dec_ctx_l, self.dec_tokens_l, t.dec_static, t.batch_top, t.dec_capacity,
            self.slow_start, *inputs, limits[0], limits[1], slots, out)

    def best_prefill_pair_one_python(self, call: Call,
                                     pf: list[float]) -> tuple[int, int, float]:
        """:meth:`best_prefill_pair_one` in pure Python: the reference of its compiled twin."""
        t = self.tables
        now = self.now
        fp = list(map(add, self.free_l, pf))  # free[p] + pf[p] per instance, the same floats
        ready = [min(members(fp)) for members in t.pf_member_values]  # each class's best member
        xcols = t.transfer_cols(call.l_in)
        tokens, count, ctx = self._decode_lists()
        # free_start: no decode limit binds, so every start is now
        weight, own_ctx, kv, free_start = self._decode_inputs(call)
        kv_true = call.kv_true
        capacity = t.dec_capacity
        best, cols, starts, ends = INF, [], {}, {}
        for d in self.decode_scan():
            if kv_true > capacity[d]:
                continue
            if free_start:
                start, end = now, decode_end(t, d, now, count, ctx, weight, own_ctx)
            else:
                start, end = decode_terms(t, d, now, tokens, count, ctx, weight, own_ctx, kv,
                                          self.slow_start)
            x = xcols[d]
            col = INF
            for k, r in enumerate(ready):
                a = r + x[k]
                v = (a if a > start else start) + end
                if v < col:
                    col = v
            if col < best:
                best, cols = col, [d]
            elif col == best:
                cols.append(d)
            starts[d], ends[d] = start, end
        if best == INF:
            return 0, 0, best  # no valid pair: argmin of an all-inf row
        # lowest p, then lowest d, reaching the minimum; only members of a class whose entry
        # reaches it can (a class's entry is its best member's)
        reach = []
        for k, r in enumerate(ready):
            for d in cols:
                a = r + xcols[d][k]
                start = starts[d]
                if (a if a > start else start) + ends[d] == best:
                    reach.append(k)
                    break
        members = t.pf_members[reach[0]] if len(reach) == 1 else sorted(
            p for k in reach for p in t.pf_members[k])
        cls = t.pf_class_list
        for p in members:
            f = fp[p]
            k = cls[p]
            for d in cols:
                a = f + xcols[d][k]
                start = starts[d]
                if (a if a > start else start) + ends[d] == best:
                    return p, d, best
        raise AssertionError("the minimum is reached by some pair")

    def _decode_inputs(self, call: Call) -> tuple[float, float, float, bool]:
        """(weight, mean own context, predicted KV demand, whether no decode limit can bind) of
        ``call`` under Ŝ: the inputs of :func:`decode_terms` / :func:`decode_end` for it."""
        weight, own_ctx, kv = self.call_constants(call)
        limits = self.limits()
        return weight, own_ctx, kv, not limits[1] and kv <= limits[0]

    @staticmethod
    def call_constants(call: Call) -> tuple[float, float, float]:
        """(weight, mean own context, predicted KV demand) of ``call``: fixed once its
        workflow has arrived (sample groups are formed then), so computed at its first
        projection and kept on the call (``Call.dec_weight``, ``own_ctx``, ``kv_demand``) for
        every later decision."""
        if call.dec_weight is None:
            l_out = float(call.l_out_pred)
            call.own_ctx = mean_own_context(call.l_in, l_out)
            call.kv_demand = float(call.kv_pred)  # as CallBatch.kv_pred (a group: its whole demand)
            call.dec_weight = l_out * call.dec_err
        return call.dec_weight, call.own_ctx, call.kv_demand

    def _decode_terms_all(self, call: Call) -> tuple[list[float], list[float]]:
        """(earliest start, decode end − now) of ``call`` on every decode instance under Ŝ, in
        scalar Python: the per-instance terms the numpy projections broadcast (same floats)."""
        t = self.tables
        now = self.now
        tokens, count, ctx = self._decode_lists()
        weight, own_ctx, kv, free_start = self._decode_inputs(call)
        decoders = range(t.num_decode)
        if free_start:  # no decode limit binds: every start is now
            return ([now] * t.num_decode,
                    [decode_end(t, d, now, count, ctx, weight, own_ctx) for d in decoders])
        starts, ends = [], []
        for d in decoders:
            start, end = decode_terms(t, d, now, tokens, count, ctx, weight, own_ctx, kv,
                                      self.slow_start)
            starts.append(start)
            ends.append(end)
        return starts, ends

    def prefill_delta_one(self, call: Call, pf: list[float]) -> np.ndarray:
        """Row ``project_prefill(batch)[i]`` (P, D) of one waiting call without a
        :class:`CallBatch`: the per-decode terms in scalar Python, the (P, D) broadcast in
        numpy, the same operations in the same order (so the same floats). ``pf``: the prefill
        seconds the projection uses on each instance."""
        t = self.tables
        starts, ends = self._decode_terms_all(call)
        arrive = np.add(self.free_l, pf)[:, None] + (t.setup + float(call.l_in) * t.s_per_token)
        row = np.maximum(arrive, starts)
        row += ends
        too_big = t.capacity < call.kv_true
        if too_big.any():
            row[:, too_big] = INF
        return row

    def decode_delta_one(self, call: Call) -> list[float]:
        """Row ``project_decode_rows(batch)[i]`` of one call at the decode stage (D floats) in
        scalar Python, same floats: finite at its own instance, and, for a free call its own
        instance cannot admit now, at every instance that can hold it (KV sent again from p)."""
        start, end = self._own_decode_terms(call)
        row = [INF] * self.tables.num_decode
        if self._may_move(call, start):
            for d, value in self._moves(call, range(len(row))):
                row[d] = value
        else:
            row[call.decode_inst] = start + end
        return row

    def _own_decode_terms(self, call: Call) -> tuple[float, float]:
        """(earliest start, decode end − now) of a decode-stage call on its own instance."""
        return self._decode_terms_at(call, call.decode_inst)

    def _decode_terms_at(self, call: Call, d: int) -> tuple[float, float]:
        """(earliest start, decode end − now) of ``call`` on decode instance ``d`` under Ŝ: one
        entry of :meth:`_decode_terms_all`.

        :func:`decode_terms` directly, without Ŝ's limits: where they bind nowhere (the
        shortcut of :meth:`_decode_terms_all`), they bind not on ``d`` either, so its start is
        ``now`` and its end :func:`decode_end`'s, the same floats; building the limits costs a
        pass over every decode instance, one entry needs ``d`` only."""
        tokens, count, ctx = self._decode_lists()
        weight, own_ctx, kv = self.call_constants(call)
        return decode_terms(self.tables, d, self.now, tokens, count, ctx, weight, own_ctx, kv,
                            self.slow_start)

    def _may_move(self, call: Call, own_start: float) -> bool:
        """Whether a waiting decode-stage call may move: free moves are on, its own instance has
        not served it (no preemption) nor has it moved, and that instance cannot admit it now."""
        return (self.free_decode and call.preempted == 0 and not call.moved
                and own_start > self.now)

    def _moves(self, call: Call, decoders: Iterable[int]) -> list[tuple[int, float]]:
        """(d, Δ) of a movable decode-stage call on each of ``decoders`` that can hold its KV:
        its own instance needs no transfer, any other gets its KV again from its prefill
        instance."""
        t, now, own = self.tables, self.now, call.decode_inst
        tokens, count, ctx = self._decode_lists()
        weight, own_ctx, kv = self.call_constants(call)
        p, l_in, kv_true = call.prefill_inst, call.l_in, call.kv_true
        setup, spt, capacity = t.setup_list[p], t.spt_list[p], t.dec_capacity
        out = []
        for d in decoders:
            if kv_true > capacity[d]:
                continue
            start, end = decode_terms(t, d, now, tokens, count, ctx, weight, own_ctx, kv,
                                      self.slow_start)
            a = now if d == own else now + (setup[d] + l_in * spt[d])
            out.append((d, (a if a > start else start) + end))
        return out

    def _decode_lists(self) -> tuple[list[float], list[int], list[float]]:
        return self.dec_tokens_l, self.dec_count_l, self.dec_ctx_l

    def best_decode_pair_one(self, call: Call) -> tuple[int, int, float]:
        """``np.argmin`` over :meth:`project_decode`'s row of a window of one call, and that Δ,
        in scalar Python (same floats as the numpy projection)."""
        own = call.decode_inst
        start, end = self._own_decode_terms(call)
        best, best_d = start + end, own
        if self._may_move(call, start):  # its KV may be sent again from its prefill instance
            best, best_d = INF, 0
            scan = self.decode_scan()
            if own not in scan:  # planned, so idle in Ŝ; unlike its twins it needs no transfer
                scan = sorted([*scan, own])
            for d, value in self._moves(call, scan):  # ascending: ties keep the lowest d
                if value < best:
                    best, best_d = value, d
        if best == INF:
            return 0, 0, best
        return call.prefill_inst, best_d, best

    def prefill_delta_at_one(self, call: Call, pf: list[float], p: int, d: int) -> float:
        """One entry of :meth:`prefill_delta_one`'s row, (p, d), in scalar Python without a
        :class:`CallBatch` (the same operations, so the same float as :meth:`project_prefill`):
        the Δ of a pick placed elsewhere than its best pair. ``pf``: the prefill seconds the
        projection uses on each instance."""
        t = self.tables
        if call.kv_true > t.dec_capacity[d]:
            return INF
        start, end = self._decode_terms_at(call, d)
        a = (self.free_l[p] + pf[p]) + (t.setup_list[p][d] + call.l_in * t.spt_list[p][d])
        return (a if a > start else start) + end

    def project_decode(self, batch: CallBatch) -> np.ndarray:
        """Δ (n, P, D) for calls waiting at the decode stage; inf elsewhere.

        A *locked* call (``batch.locked``) has one finite entry, its (p, d). A *free* call whose
        own instance cannot admit it now may move to any decode instance that can hold it: row
        ``p`` = its prefill instance, and a move to d' ≠ d first re-sends its KV (the P→D
        transfer time of p, d')."""
        t = self.tables
        n = len(batch.kv_pred)
        delta = np.full((n, t.num_prefill, t.num_decode), INF)
        delta[np.arange(n), batch.prefill_inst] = self.project_decode_rows(batch)
        return delta

    def project_decode_rows(self, batch: CallBatch) -> np.ndarray:
        """The only row of :meth:`project_decode` that can be finite, ``p`` = each call's
        prefill instance: (n, D)."""
        t = self.tables
        n = len(batch.kv_pred)
        rows = np.arange(n)
        base, slope = self._tau
        d = batch.decode_inst
        dec = batch.weight * (base[d] + slope[d] * batch.ctx)
        start = self.decode_starts(batch.kv_pred)
        start_own = start if isinstance(start, float) else start[rows, d]
        delta = np.full((n, t.num_decode), INF)
        delta[rows, d] = start_own + (dec - self.now)
        # a free call may move only when its own instance cannot admit it now
        if self.free_decode and not isinstance(start_own, float) and not batch.locked.all():
            f = np.flatnonzero(~batch.locked & (start_own > self.now))
            p = batch.prefill_inst[f]
            arrive = self.now + (t.setup[p] + batch.l_in[f, None] * t.s_per_token[p])
            arrive[np.arange(len(f)), d[f]] = self.now  # (m, D): when its KV could be on d'
            dec_all = batch.weight[f, None] * (base[None, :] + slope[None, :]
                                               * batch.ctx[f, None])
            st = start if isinstance(start, float) else start[f]
            val = np.maximum(arrive, st) + (dec_all - self.now)
            if batch.any_too_big:
                val[batch.too_big[f]] = INF
            delta[f] = val
        return delta
