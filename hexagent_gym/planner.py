"""The planner's simulated state Ŝ and the projections Δ(c, p, d) (docs/simulator.md).

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

import bisect
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from hexagent_gym.cluster import ClusterSpec
    from hexagent_gym.entities import Call, DecodeInstance, PrefillInstance

INF = float("inf")
_SLOPE_SPAN = 8192.0  # context tokens over which the per-token slope of step time is measured


class ClusterTables:
    """Per-cluster constants for the hot path, shared by every episode on that cluster."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        self.num_prefill = len(cluster.prefill)
        self.num_decode = len(cluster.decode)
        self.setup = np.asarray(cluster.transfer_setup_s, dtype=np.float64)
        self.s_per_token = np.asarray(cluster.transfer_s_per_token, dtype=np.float64)
        self.setup_list = self.setup.tolist()
        self.spt_list = self.s_per_token.tolist()
        self.capacity = np.array([d.kv_capacity_tokens for d in cluster.decode], dtype=np.float64)
        self.max_batch = np.array([d.max_batch_size for d in cluster.decode], dtype=np.int64)
        # Distinct latency models ("classes") so per-call work is per class, not per instance.
        self.pf_models, self.pf_class = _classes([p.latency for p in cluster.prefill])
        self.dec_models, self.dec_class = _classes([d.latency for d in cluster.decode])
        self._pf_cache: dict[int, tuple[list[float], list[float]]] = {}
        self._pf_hit_cache: dict[tuple[int, int], list[float]] = {}
        self.pf_class_list = self.pf_class.tolist()
        self._pool_cache: dict[tuple[int, int], float] = {}
        # prefill instances of one class share speed and network rows: the placement rule only
        # needs the least-loaded member of each class
        self.pf_members = [[p for p, k in enumerate(self.pf_class.tolist()) if k == c]
                           for c in range(len(self.pf_models))]
        self.pf_rep = [m[0] for m in self.pf_members]
        # class-contiguous order of prefill instances, for one reduceat over each class
        self.pf_perm = np.array([p for m in self.pf_members for p in m], dtype=np.int64)
        self.pf_starts = np.cumsum([0] + [len(m) for m in self.pf_members[:-1]])
        self.setup_cls = self.setup[self.pf_rep]  # (K, D): a class's members share these rows
        self.spt_cls = self.s_per_token[self.pf_rep]
        self._class_sizes = [len(m) for m in self.pf_members]
        self._xcol_cache: dict[int, list[list[float]]] = {}
        self._xrow_cache: dict[int, list[list[float]]] = {}
        width = int(self.max_batch.max()) + 2
        base = np.zeros((len(self.dec_models), width))
        slope = np.zeros((len(self.dec_models), width))
        for k, lm in enumerate(self.dec_models):
            for b in range(1, width):
                t0 = lm.decode_step_time(b, 0)
                base[k, b] = t0
                slope[k, b] = (lm.decode_step_time(b, _SLOPE_SPAN * b) - t0) / (_SLOPE_SPAN * b)
        self.dec_base = base[self.dec_class]  # (D, width): step time of a batch of b, no context
        self.dec_slope = slope[self.dec_class]  # (D, width): seconds per context token
        self.dec_base_list = self.dec_base.tolist()
        self.dec_slope_list = self.dec_slope.tolist()
        self.batch_top = width - 1  # decode tables are clamped at this batch size
        self.dec_static = list(zip(self.capacity.tolist(), self.max_batch.tolist(),
                                   self.dec_base_list, self.dec_slope_list, strict=True))
        self._d_range = np.arange(self.num_decode)
        # one representative per class pair for standalone estimates: (p, setup row, s/token row)
        dec_rep = [self.dec_class.tolist().index(k) for k in range(len(self.dec_models))]
        self._alone_dec = [(float(base[k, 1]), float(slope[k, 1])) for k in range(len(dec_rep))]
        self._alone_pairs = [(p, self.setup[p, dec_rep].tolist(),
                              self.s_per_token[p, dec_rep].tolist()) for p in self.pf_rep]

    def prefill_times(self, input_tokens: int) -> tuple[list[float], list[float]]:
        """True prefill seconds of a prompt per prefill instance and per prefill class, cached."""
        hit = self._pf_cache.get(input_tokens)
        if hit is None:
            per_class = [lm.prefill_time(input_tokens) for lm in self.pf_models]
            hit = ([per_class[k] for k in self.pf_class.tolist()], per_class)
            self._pf_cache[input_tokens] = hit
        return hit

    def prefill_times_hit(self, input_tokens: int, cached: int) -> list[float]:
        """True prefill seconds per prefill *class* when ``cached`` prompt tokens hit, cached."""
        if cached <= 0:
            return self.prefill_times(input_tokens)[1]
        key = (input_tokens, cached)
        hit = self._pf_hit_cache.get(key)
        if hit is None:
            hit = [lm.prefill_time(input_tokens, cached) for lm in self.pf_models]
            self._pf_hit_cache[key] = hit
        return hit

    def pool_seconds(self, input_tokens: int, cached: int) -> float:
        """Prefill-pool seconds of one prompt with ``cached`` tokens hit: its prefill with every
        instance working on it in parallel at its own speed (``hexagent_gym.load``), cached."""
        key = (input_tokens, cached)
        hit = self._pool_cache.get(key)
        if hit is None:
            per_class = self.prefill_times_hit(input_tokens, cached)
            hit = 1.0 / sum(n / t for n, t in zip(self._class_sizes, per_class, strict=True))
            self._pool_cache[key] = hit
        return hit

    def transfer_cols(self, input_tokens: int) -> list[list[float]]:
        """KV-transfer seconds per (decode instance, prefill class) of a prompt, cached."""
        hit = self._xcol_cache.get(input_tokens)
        if hit is None:
            hit = [[self.setup_list[p][d] + input_tokens * self.spt_list[p][d]
                    for p in self.pf_rep] for d in range(self.num_decode)]
            self._xcol_cache[input_tokens] = hit
        return hit

    def transfer_rows(self, input_tokens: int) -> list[list[float]]:
        """KV-transfer seconds per (decode instance, prefill instance) of a prompt (uncached:
        used only for calls with cache hits)."""
        hit = self._xrow_cache.get(input_tokens)
        if hit is None:
            hit = [[self.setup_list[p][d] + input_tokens * self.spt_list[p][d]
                    for p in range(self.num_prefill)] for d in range(self.num_decode)]
            self._xrow_cache[input_tokens] = hit
        return hit

    def decode_tau(self, count: np.ndarray, ctx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per-token step time (base, per-context-token slope) of each decode instance when one
        more call joins ``count`` committed calls holding ``ctx`` context tokens."""
        b = np.minimum(count + 1, self.dec_base.shape[1] - 1)
        slope = self.dec_slope[self._d_range, b]
        return self.dec_base[self._d_range, b] + slope * ctx, slope

    def standalone_estimate(self, pf_est: list[float], l_in: int, l_out: float,
                            dec_err: float) -> float:
        """A call's duration alone on the empty cluster at its best pair (scheduler-visible).

        Instances of one class share every term, so the minimum runs over class pairs."""
        ctx = l_in + 0.5 * (l_out - 1.0)
        dec = [l_out * (b + s * ctx) * dec_err for b, s in self._alone_dec]
        best = INF
        for p, setup, spt in self._alone_pairs:
            pf = pf_est[p]
            for j, x in enumerate(dec):
                v = pf + setup[j] + l_in * spt[j] + x
                if v < best:
                    best = v
        return best


def _classes(models: list) -> tuple[list, np.ndarray]:
    distinct: list = []
    index = []
    for m in models:
        for k, known in enumerate(distinct):
            if known is m:
                index.append(k)
                break
        else:
            index.append(len(distinct))
            distinct.append(m)
    return distinct, np.array(index, dtype=np.int64)


class CallBatch:
    """Constant per-call arrays of a decision's window, built once and reused at every pick."""

    __slots__ = ("pf", "weight", "ctx", "kv_pred", "l_in", "too_big", "any_too_big",
                 "prefill_inst", "decode_inst", "arrival", "h_est", "locked", "_xfer",
                 "_xfer_cls", "_tables", "_calls", "_cached")

    def __init__(self, tables: ClusterTables, calls: list[Call], cache_aware: bool = True) -> None:
        self._tables = tables
        self.l_in = l_in = np.array([c.l_in for c in calls], dtype=np.float64)
        l_out = np.array([c.l_out_pred for c in calls], dtype=np.float64)
        err = np.array([c.dec_err for c in calls])
        # (n, P) estimated prefill seconds: with the cache hits each instance offers, or cold
        self.pf = np.array([c.pf_est if cache_aware else c.pf_cold for c in calls])
        # at the decode stage a call is locked to its instance once that instance has served it
        # (a preempted call) or once it has moved; before that it is free to move
        self.locked = np.array([c.preempted > 0 or c.moved for c in calls], dtype=bool)
        self._calls = calls
        self._cached = None
        self.weight = l_out * err  # decode seconds = weight · per-token step time
        self.ctx = l_in + 0.5 * (l_out - 1.0)  # mean own context over the call's decode
        self.kv_pred = l_in + l_out
        self._xfer = self._xfer_cls = None
        kv_true = np.array([c.kv_true for c in calls], dtype=np.float64)
        self.too_big = kv_true[:, None] > tables.capacity[None, :]  # (n, D) never fits
        self.any_too_big = bool(self.too_big.any())
        self.prefill_inst = np.array([c.prefill_inst for c in calls], dtype=np.int64)
        self.decode_inst = np.array([c.decode_inst for c in calls], dtype=np.int64)
        self.arrival = np.array([c.workflow.arrival for c in calls])  # workflow arrival a_w
        self.h_est = np.array([c.workflow.h_est for c in calls])  # running horizon H_w(t)

    @property
    def cached(self) -> np.ndarray:
        """(n, P) prompt tokens each prefill instance's cache holds for each call (built on
        first use)."""
        if self._cached is None:
            t = self._tables
            self._cached = np.zeros((len(self._calls), t.num_prefill))
            for i, c in enumerate(self._calls):
                if c.cached is not None:
                    self._cached[i] = c.cached
        return self._cached

    @property
    def xfer(self) -> np.ndarray:
        """(n, P, D) KV-transfer seconds of each call on each pair (built on first use)."""
        if self._xfer is None:
            t = self._tables
            self._xfer = t.setup + self.l_in[:, None, None] * t.s_per_token
        return self._xfer

    @property
    def xfer_cls(self) -> np.ndarray:
        """(n, K, D) KV-transfer seconds per prefill class (the same values as :attr:`xfer` on
        any member of the class)."""
        if self._xfer_cls is None:
            t = self._tables
            self._xfer_cls = t.setup_cls + self.l_in[:, None, None] * t.spt_cls
        return self._xfer_cls

    def row(self, i: int) -> CallBatch:
        """A one-call batch viewing row ``i`` (no copies)."""
        out = CallBatch.__new__(CallBatch)
        for name in CallBatch.__slots__:
            value = getattr(self, name)
            if name in ("any_too_big", "_tables") or value is None:
                setattr(out, name, value)
            else:
                setattr(out, name, value[i:i + 1])
        out.any_too_big = bool(out.too_big.any())
        return out


class PlanState:
    """Ŝ: projected prefill free times and decode reservations, updated pick by pick.

    Attributes (all scheduler-visible, updated by :meth:`commit`; the arrays are read-only
    views built on first use, the state itself lives in Python lists that scalar paths read):
        now: simulated time of the decision (s).
        free: (P,) time each prefill instance could start a newly placed call (s, absolute).
        pf_tokens: (P,) prompt tokens queued or running per prefill instance.
        dec_tokens: (D,) predicted KV tokens committed per decode instance.
        dec_count: (D,) calls committed per decode instance (running, waiting or inbound).
        dec_ctx: (D,) Σ (L_in + L_out_pred/2) over those calls.
        tables: the cluster's :class:`ClusterTables` (capacity, max_batch, transfer tables).
    """

    def __init__(self, tables: ClusterTables, now: float, free: list[float],
                 dec_tokens: list[float], dec_count: list[int], dec_ctx: list[float],
                 decode: list[DecodeInstance], exclude: set[int],
                 pf_tokens: list[float] | None = None) -> None:
        self.tables = tables
        self.now = now
        self.free_l = free
        self.dec_tokens_l = dec_tokens
        self.dec_count_l = dec_count
        self.dec_ctx_l = dec_ctx
        # prompt tokens queued or running on each prefill instance (speed-unaware load)
        self.pf_tokens_l = pf_tokens if pf_tokens is not None else [0.0] * tables.num_prefill
        self._arrays: dict[str, np.ndarray] = {}
        self._decode = decode
        self._exclude = exclude  # uids being planned: not counted as existing reservations
        self._releases: dict[int, list[tuple[float, float]]] = {}
        self._picked: dict[int, list[tuple[float, float]]] = {}
        self._tau_cache: tuple[np.ndarray, np.ndarray] | None = None
        self._start_memo: tuple[CallBatch, np.ndarray | float] | None = None
        self.free_decode = True  # waiting decode calls not yet served may move (project_decode)

    def _array(self, name: str, dtype: type) -> np.ndarray:
        arr = self._arrays.get(name)
        if arr is None:
            arr = self._arrays[name] = np.array(getattr(self, name + "_l"), dtype=dtype)
        return arr

    @property
    def free(self) -> np.ndarray:
        return self._array("free", np.float64)

    @property
    def pf_tokens(self) -> np.ndarray:
        return self._array("pf_tokens", np.float64)

    @property
    def dec_tokens(self) -> np.ndarray:
        return self._array("dec_tokens", np.float64)

    @property
    def dec_count(self) -> np.ndarray:
        return self._array("dec_count", np.int64)

    @property
    def dec_ctx(self) -> np.ndarray:
        return self._array("dec_ctx", np.float64)

    @property
    def _tau(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-token step time (base, slope) of each decode instance with one more call
        (:meth:`ClusterTables.decode_tau`), built on first use and kept current by commits."""
        if self._tau_cache is None:
            self._tau_cache = self.tables.decode_tau(self.dec_count, self.dec_ctx)
        return self._tau_cache

    # -- projections ---------------------------------------------------------------------------
    def decode_starts(self, kv: np.ndarray) -> np.ndarray | float:
        """Earliest admission time (n, D) on every decode instance for predicted demands ``kv``.

        Returns the scalar ``now`` when no decode limit binds for any of the calls (the common
        case), which broadcasts like the full array.
        """
        t = self.tables
        over = self.dec_count - t.max_batch + 1
        slack = t.capacity - self.dec_tokens
        binding = (np.minimum(kv.max(), t.capacity) > slack) | (over > 0)
        if not binding.any():
            return self.now
        need = np.minimum(kv[:, None], t.capacity) - slack
        start = np.full(need.shape, self.now)
        for d in np.flatnonzero(binding).tolist():
            rel = self._release_list(d)
            times = np.array([r[0] for r in rel] + [INF])
            cum = np.cumsum([r[1] for r in rel] + [0.0])
            col = need[:, d]
            at = times[np.minimum(np.searchsorted(cum, col, side="left"), len(rel))]
            col_start = np.where(col <= 0.0, self.now, at)
            if over[d] > 0:
                col_start = np.maximum(col_start, times[min(int(over[d]) - 1, len(rel))])
            start[:, d] = np.maximum(col_start, self.now)
        return start

    def slow_start(self, d: int, need: float, over: int) -> float:
        """Scalar ``decode_starts`` for one call on a decode instance whose limits bind."""
        rel = self._release_list(d)
        start = self.now
        if need > 0.0:
            acc = 0.0
            t_kv = INF
            for when, tokens in rel:
                acc += tokens
                if acc >= need:
                    t_kv = when
                    break
            start = max(start, t_kv)
        if over > 0:
            start = max(start, rel[over - 1][0] if over - 1 < len(rel) else INF)
        return start

    def earliest_pair(self, call: Call) -> tuple[int, int, float]:
        """The fallback placement of a waiting call: see :func:`earliest_pair`."""
        return earliest_pair(self.tables, self.now, self.free_l, self.dec_tokens_l,
                             self.dec_count_l, self.dec_ctx_l, call, self.slow_start)

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

        Only the decode instances where the minimum occurs are expanded over every prefill
        instance (exact ties between members and classes are resolved as the full row would)."""
        best = float(classes.min())
        if best == INF:
            return 0, 0, best  # no valid pair: argmin of an all-inf row
        cols = np.flatnonzero(classes.min(axis=0) == best)
        t = self.tables
        arrive = (self.free + batch.pf[i])[:, None] + (
            t.setup[:, cols] + batch.l_in[i] * t.s_per_token[:, cols])
        memo = self._start_memo
        if memo is not None and memo[0] is batch:
            start = memo[1] if isinstance(memo[1], float) else memo[1][i, cols]
        else:
            start = self.decode_starts(batch.kv_pred[i:i + 1])
            if not isinstance(start, float):
                start = start[0, cols]
        base, slope = self._tau
        dec = batch.weight[i] * (base[cols] + slope[cols] * batch.ctx[i])
        sub = np.maximum(arrive, start) + (dec - self.now)
        p, j = divmod(int(np.argmin(sub)), len(cols))
        return p, int(cols[j]), best

    def best_prefill_pair_one(self, call: Call, pf: list[float]) -> tuple[int, int, float]:
        """:meth:`best_prefill_pair` for a window of one call, in scalar Python (the common
        decision; numpy's per-call overhead dominates at this size). ``pf``: the prefill
        seconds the projection uses on each instance. Same floats, same tie-breaking."""
        t = self.tables
        now = self.now
        free = self.free_l
        ready = []  # per prefill class: its best member's free + prefill
        for members in t.pf_members:
            r = INF
            for p in members:
                v = free[p] + pf[p]
                if v < r:
                    r = v
            ready.append(r)
        xcols = t.transfer_cols(call.l_in)
        tokens, count, ctx = self._decode_lists()
        top = t.batch_top
        l_out = float(call.l_out_pred)
        weight = l_out * call.dec_err
        own_ctx = call.l_in + 0.5 * (l_out - 1.0)
        kv = float(call.l_in + call.l_out_pred)  # as CallBatch.kv_pred
        kv_true = call.kv_true
        best, cols, starts, ends = INF, [], {}, {}
        for d, (cap, max_batch, base_row, slope_row) in enumerate(t.dec_static):
            if kv_true > cap:
                continue
            n = count[d]
            b = n + 1 if n < top else top
            slope = slope_row[b]
            end = weight * ((base_row[b] + slope * ctx[d]) + slope * own_ctx) - now
            need = (kv if kv < cap else cap) - (cap - tokens[d])
            start = now if need <= 0.0 and n < max_batch else self.slow_start(
                d, need, n - max_batch + 1)
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
        cls = t.pf_class_list
        for p, f in enumerate(free):  # lowest p, then lowest d, reaching the minimum
            fp = f + pf[p]
            k = cls[p]
            for d in cols:
                a = fp + xcols[d][k]
                start = starts[d]
                if (a if a > start else start) + ends[d] == best:
                    return p, d, best
        raise AssertionError("the minimum is reached by some pair")

    def _decode_lists(self) -> tuple[list[float], list[int], list[float]]:
        return self.dec_tokens_l, self.dec_count_l, self.dec_ctx_l

    def best_decode_pair_one(self, call: Call) -> tuple[int, int, float]:
        """``np.argmin`` over :meth:`project_decode`'s row of a window of one call, and that Δ,
        in scalar Python (same floats as the numpy projection)."""
        t = self.tables
        now = self.now
        p, own = call.prefill_inst, call.decode_inst
        tokens, count, ctx = self._decode_lists()
        top = t.batch_top
        l_out = float(call.l_out_pred)
        weight = l_out * call.dec_err
        own_ctx = call.l_in + 0.5 * (l_out - 1.0)
        kv = float(call.l_in + call.l_out_pred)  # as CallBatch.kv_pred

        def finish(d: int) -> tuple[float, float]:  # (earliest start, decode end − now) on d
            cap, max_batch, base_row, slope_row = t.dec_static[d]
            n = count[d]
            b = n + 1 if n < top else top
            slope = slope_row[b]
            end = weight * ((base_row[b] + slope * ctx[d]) + slope * own_ctx) - now
            need = (kv if kv < cap else cap) - (cap - tokens[d])
            start = now if need <= 0.0 and n < max_batch else self.slow_start(
                d, need, n - max_batch + 1)
            return start, end

        start, end = finish(own)
        best, best_d = start + end, own
        if self.free_decode and call.preempted == 0 and not call.moved and start > now:
            # its own instance cannot admit it now: it may move (its KV sent again from p)
            setup, spt, l_in, kv_true = t.setup_list[p], t.spt_list[p], call.l_in, call.kv_true
            best, best_d = INF, 0
            for d in range(t.num_decode):
                if kv_true > t.dec_static[d][0]:
                    continue
                start, end = finish(d)
                a = now if d == own else now + (setup[d] + l_in * spt[d])
                v = (a if a > start else start) + end
                if v < best:
                    best, best_d = v, d
        if best == INF:
            return 0, 0, best
        return p, best_d, best

    def prefill_delta_at(self, batch: CallBatch, p: int, d: int) -> float:
        """One entry ``project_prefill(batch)[0, p, d]`` of a one-call batch (same float)."""
        if batch.too_big[0, d]:
            return INF
        t = self.tables
        arrive = (self.free_l[p] + batch.pf[0, p]) + (t.setup[p, d]
                                                    + batch.l_in[0] * t.s_per_token[p, d])
        start = self.decode_starts(batch.kv_pred)
        if not isinstance(start, float):
            start = start[0, d]
        base, slope = self._tau
        dec = batch.weight[0] * (base[d] + slope[d] * batch.ctx[0])
        return float(max(arrive, start) + (dec - self.now))

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

    def copy(self) -> PlanState:
        """An independent Ŝ for what-if picks (lookahead): committing to the copy leaves this
        state's projections unchanged. Arrays and reservation lists are copied; the cluster
        tables, the live decode instances and the excluded uids are shared read-only."""
        new = PlanState.__new__(PlanState)
        new.tables = self.tables
        new.now = self.now
        new.free_l = list(self.free_l)
        new.pf_tokens_l = list(self.pf_tokens_l)
        new.dec_tokens_l = list(self.dec_tokens_l)
        new.dec_count_l = list(self.dec_count_l)
        new.dec_ctx_l = list(self.dec_ctx_l)
        new._arrays = {}
        new._decode = self._decode
        new._exclude = self._exclude
        new._releases = {d: list(r) for d, r in self._releases.items()}
        new._picked = {d: list(p) for d, p in self._picked.items()}
        tau = self._tau_cache
        new._tau_cache = None if tau is None else (tau[0].copy(), tau[1].copy())
        new._start_memo = None
        new.free_decode = self.free_decode
        return new

    # -- picks ----------------------------------------------------------------------------------
    def commit(self, call: Call, p: int, d: int, delta: float, prefill_stage: bool,
               pf: float | None = None) -> None:
        """Reserve the picked placement in Ŝ so later projections see it (``pf``: the prefill
        seconds the projection used on p; default the call's cache-aware ``pf_est[p]``)."""
        self._start_memo = None
        arrays = self._arrays
        if prefill_stage:
            self.free_l[p] += call.pf_est[p] if pf is None else pf
            self.pf_tokens_l[p] += call.l_in
            if "free" in arrays:
                arrays["free"][p] = self.free_l[p]
            if "pf_tokens" in arrays:
                arrays["pf_tokens"][p] = self.pf_tokens_l[p]
        self.dec_tokens_l[d] += call.kv_pred
        self.dec_count_l[d] += 1
        self.dec_ctx_l[d] += call.l_in + 0.5 * call.l_out_pred
        for name in ("dec_tokens", "dec_count", "dec_ctx"):
            if name in arrays:
                arrays[name][d] = getattr(self, name + "_l")[d]
        item = (self.now + delta, float(call.kv_pred))
        self._picked.setdefault(d, []).append(item)
        rel = self._releases.get(d)
        if rel is not None:
            bisect.insort(rel, item)
        # only d's step time changed: refresh its entry (same arithmetic as decode_tau)
        tau = self._tau_cache
        if tau is not None:
            t = self.tables
            b = min(self.dec_count_l[d] + 1, t.batch_top)
            slope = t.dec_slope_list[d][b]
            tau[0][d] = t.dec_base_list[d][b] + slope * self.dec_ctx_l[d]
            tau[1][d] = slope

    def _release_list(self, d: int) -> list[tuple[float, float]]:
        """Projected (release time, tokens) of every reservation on d, sorted; built lazily."""
        rel = self._releases.get(d)
        if rel is not None:
            return rel
        inst = self._decode[d]
        now = self.now
        inst.advance(now)
        rel = []
        step = inst.step
        groups: dict[int, tuple[float, float]] = {}
        for _, _, c in inst.batch:
            left = c.v_finish_pred - inst.v
            when = now + max(left, 1.0) * step
            lead = c.lead if c.lead is not None else c
            if lead.width == 1:
                rel.append((when, float(c.kv_pred)))
            else:  # a sample group frees its reservation with its last sample
                prev = groups.get(lead.uid)
                if prev is None or when > prev[0]:
                    groups[lead.uid] = (when, float(lead.kv_pred))
        rel.extend(groups.values())
        for ready, c in inst.recomputing.values():  # admitted, rebuilding its KV: still holds it
            left = max(c.l_out_pred - c.generated, 1.0)
            rel.append((max(ready, now) + left * step, float(c.kv_pred)))
        for c in inst.inbound.values():
            if c.uid not in self._exclude:
                rel.append((max(c.proj_release, now), float(c.kv_pred)))
        rel.extend(self._picked.get(d, ()))
        rel.sort()
        self._releases[d] = rel
        return rel


def earliest_pair(tables: ClusterTables, now: float, free: list[float], tokens: list[float],
                  count: list[int], ctx: list[float], call: Call,
                  slow_start: Callable[[int, float, int], float]) -> tuple[int, int, float]:
    """The core's placement rule: the pair with the earliest projected finish Δ.

    Ties go to the lowest decode index, and within a decode instance to the prefill instance
    whose KV arrives first (then the lowest index). The arithmetic mirrors
    :meth:`PlanState.project_prefill` operation for operation, so the chosen pair's Δ equals that
    tensor's entry exactly. Scalar Python over classes and decode instances: at this size it
    beats numpy's per-call overhead several times.

    Returns:
        (p, d, Δ) with Δ in seconds from ``now``.
    """
    if call.cached is None:
        # least-loaded member of each prefill class (lowest index on ties): (free + prefill, p)
        cands = []
        pf = call.pf_cls
        for k, members in enumerate(tables.pf_members):
            bp = members[0]
            bf = free[bp]
            for p in members[1:]:
                if free[p] < bf:
                    bp, bf = p, free[p]
            cands.append((bf + pf[k], bp))
        xcols = tables.transfer_cols(call.l_in)
    else:
        # a cache hit makes instances of one class differ: every instance with a hit is a
        # candidate, plus the least-loaded member without one of each class
        pf = call.pf_est
        cached = call.cached
        cands = []
        for members in tables.pf_members:
            bp, bf = -1, INF
            for p in members:
                if cached[p]:
                    cands.append((free[p] + pf[p], p))
                elif free[p] < bf:
                    bp, bf = p, free[p]
            if bp >= 0:
                cands.append((bf + pf[bp], bp))
        rows = tables.transfer_rows(call.l_in)
        xcols = [[row[p] for _, p in cands] for row in rows]
    top = tables.batch_top
    l_out = call.l_out_pred
    weight = l_out * call.dec_err
    own_ctx = call.l_in + 0.5 * (l_out - 1.0)
    kv_pred, kv_true = call.kv_pred, call.kv_true
    best, best_d, best_p = INF, -1, -1
    for d, (cap, max_batch, base_row, slope_row) in enumerate(tables.dec_static):
        if kv_true > cap:
            continue
        n = count[d]
        b = n + 1 if n < top else top
        slope = slope_row[b]
        tau = base_row[b] + slope * ctx[d]
        dec = weight * (tau + slope * own_ctx)
        need = (kv_pred if kv_pred < cap else cap) - (cap - tokens[d])
        start = now if need <= 0.0 and n < max_batch else slow_start(d, need, n - max_batch + 1)
        a, ap = INF, -1
        for (val, p), x in zip(cands, xcols[d], strict=True):
            x = val + x  # KV arrival on d; earliest wins, lowest prefill index on ties
            if x < a or (x == a and p < ap):
                a, ap = x, p
        fin = (a if a > start else start) + (dec - now)
        if fin < best:
            best, best_d, best_p = fin, d, ap
    return best_p, best_d, best


def snapshot(tables: ClusterTables, now: float, prefill: list[PrefillInstance],
             decode: list[DecodeInstance], planned: list[Call], prefill_stage: bool) -> PlanState:
    """Build Ŝ at ``now`` for planning ``planned`` (those calls hold no reservation in Ŝ)."""
    exclude = {c.uid for c in planned}
    work = [inst.queued_est for inst in prefill]
    pf_tokens = [float(inst.load_tokens) for inst in prefill]
    tokens = [float(x.committed_pred) for x in decode]
    count = [x.committed_count for x in decode]
    ctx = [x.sched_ctx for x in decode]
    for c in planned:  # a call being (re-)planned gives up its current place in Ŝ
        if c.decode_inst >= 0:
            if prefill_stage:
                work[c.prefill_inst] -= c.pf_queued
                pf_tokens[c.prefill_inst] -= c.l_in
            d = c.decode_inst
            tokens[d] -= c.kv_pred
            count[d] -= 1
            ctx[d] -= c.l_in + 0.5 * c.l_out_pred
    free = [(end if end > now else now) + (w if w > 0.0 else 0.0)
            for end, w in zip([inst.run_end for inst in prefill], work, strict=True)]
    state = PlanState(tables, now, free, tokens, count, ctx, decode, exclude, pf_tokens)
    return state

