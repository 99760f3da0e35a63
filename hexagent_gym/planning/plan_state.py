"""Ŝ, the planner's simulated state: projected prefill free times and decode reservations,
updated pick by pick (:class:`PlanState`), and its construction from the live cluster
(:func:`snapshot`). Everything here is scheduler-visible (docs/simulator.md)."""

from __future__ import annotations

import bisect
from operator import attrgetter, ge, sub
from typing import TYPE_CHECKING

import numpy as np

from hexagent_gym.planning import kernels
from hexagent_gym.planning.cluster_tables import INF
from hexagent_gym.planning.entities import prefill_free_times
from hexagent_gym.planning.placement import decode_scan, earliest_pair
from hexagent_gym.planning.projections import Projections

if TYPE_CHECKING:
    from hexagent_gym.planning.call_batch import CallBatch
    from hexagent_gym.planning.cluster_tables import ClusterTables
    from hexagent_gym.planning.entities import Call, DecodeInstance, SchedulerLoads


class PlanState(Projections):
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
        fault_down: (prefill, decode) instance sets a fault made unavailable (docs/faults.md).
    """

    fault_down: tuple[frozenset[int], frozenset[int]] = (frozenset(), frozenset())

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
        # calls still waiting for their prefill hold no reservation either (snapshot's flag)
        self.skip_queued = False
        self._releases: dict[int, list[tuple[float, float]]] = {}
        self._pick_log: list[tuple[int, float, float]] = []  # (d, release, tokens) per pick
        self._tau_cache: tuple[np.ndarray, np.ndarray] | None = None
        self._start_memo: tuple[CallBatch, np.ndarray | float] | None = None
        self._scan: list[int] | None = None
        self._limits: tuple[float, bool] | None = None  # (_decode_limits), built on first use
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
        limits = self.limits()
        if not limits[1] and float(kv.max()) <= limits[0]:
            return self.now  # every call fits in every instance's slack, no batch is full
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

    def limits(self) -> tuple[float, bool]:
        """(smallest KV slack over the decode instances, whether any batch is full) under Ŝ:
        built once, then kept current by every commit."""
        limits = self._limits
        if limits is None:
            limits = self._limits = self._decode_limits()
        return limits

    def kernel_limits(self) -> tuple[float, bool] | tuple[None, None]:
        """:meth:`limits` for a compiled kernel: as built, else ``(None, None)``, which lets the
        kernel derive them (same floats) from the decode lists it reads anyway, instead of a
        pass over every decode instance of its own (Ŝ keeps them unbuilt: a later
        :meth:`limits` builds the same values from the lists the commits kept current)."""
        return self._limits or _DERIVED_LIMITS

    def _decode_limits(self) -> tuple[float, bool]:
        """(smallest KV slack over the decode instances, whether any batch is full): the test
        that no decode limit can bind, kept current by commits (they only shrink the slack and
        fill batches). Same floats as ``capacity − dec_tokens``."""
        t = self.tables
        if kernels.decode_limits is not None:
            return kernels.decode_limits(t.dec_capacity, self.dec_tokens_l, self.dec_count_l,
                                         t.max_batch_list)
        return decode_limits_python(t.dec_capacity, self.dec_tokens_l, self.dec_count_l,
                                    t.max_batch_list)

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

    def decode_scan(self) -> list[int]:
        """:func:`~hexagent_gym.planning.placement.decode_scan` of Ŝ's decode lists, kept until a
        commit changes an idle instance (never mutated in place: copies may share it)."""
        scan = self._scan
        if scan is None:
            scan = self._scan = decode_scan(self.tables, self.dec_tokens_l, self.dec_count_l,
                                            self.dec_ctx_l)
        return scan

    def earliest_pair(self, call: Call) -> tuple[int, int, float]:
        """The fallback placement of a waiting call: see :func:`earliest_pair`."""
        return earliest_pair(self.tables, self.now, self.free_l, self.dec_tokens_l,
                             self.dec_count_l, self.dec_ctx_l, call, self.slow_start,
                             self.decode_scan())

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
        new.skip_queued = self.skip_queued
        new._releases = {d: list(r) for d, r in self._releases.items()}
        new._pick_log = list(self._pick_log)
        tau = self._tau_cache
        new._tau_cache = None if tau is None else (tau[0].copy(), tau[1].copy())
        new._start_memo = None
        new._scan = self._scan
        new._limits = self._limits
        new.free_decode = self.free_decode
        return new

    # -- picks ----------------------------------------------------------------------------------
    def commit(self, call: Call, p: int, d: int, delta: float, prefill_stage: bool,
               pf: float | None = None) -> None:
        """Reserve the picked placement in Ŝ so later projections see it (``pf``: the prefill
        seconds the projection used on p; default the call's cache-aware ``pf_est[p]``)."""
        self._start_memo = None
        arrays = self._arrays  # numpy twins of the lists, only those a projection asked for
        if prefill_stage:
            free_l, pf_tokens_l = self.free_l, self.pf_tokens_l
            free_l[p] += call.pf_est[p] if pf is None else pf
            pf_tokens_l[p] += call.l_in
            if arrays:
                if "free" in arrays:
                    arrays["free"][p] = free_l[p]
                if "pf_tokens" in arrays:
                    arrays["pf_tokens"][p] = pf_tokens_l[p]
        tokens, count, ctx = self.dec_tokens_l, self.dec_count_l, self.dec_ctx_l
        if self._scan is not None and not count[d] and tokens[d] <= 0.0:
            self._scan = None  # d was idle: it leaves its twins
        kv = call.kv_pred
        tokens[d] += kv
        count[d] += 1
        ctx[d] += call.ctx_share
        limits = self._limits
        if limits is not None:
            t = self.tables
            slack = t.dec_capacity[d] - tokens[d]
            self._limits = (slack if slack < limits[0] else limits[0],
                            limits[1] or count[d] >= t.max_batch_list[d])
        if arrays:
            for name, values in (("dec_tokens", tokens), ("dec_count", count),
                                 ("dec_ctx", ctx)):
                if name in arrays:
                    arrays[name][d] = values[d]
        when, tokens_f = self.now + delta, float(kv)
        self._pick_log.append((d, when, tokens_f))
        rel = self._releases.get(d)
        if rel is not None:
            bisect.insort(rel, (when, tokens_f))
        # only d's step time changed: refresh its entry (same arithmetic as decode_tau)
        tau = self._tau_cache
        if tau is not None:
            t = self.tables
            b = min(count[d] + 1, t.batch_top)
            slope = t.dec_slope_list[d][b]
            tau[0][d] = t.dec_base_list[d][b] + slope * ctx[d]
            tau[1][d] = slope

    def commit_prefill_picks(self, picks: list[tuple[Call, int, int, float]],
                             cache_aware: bool = True) -> None:
        """:meth:`commit` of each prefill-stage pick ``(call, p, d, delta)`` in turn, with the
        prefill seconds ``call.pf_est[p]`` (``pf_cold[p]`` when not ``cache_aware``): the same
        Ŝ, bit for bit. A followed plan commits its picks here in one loop; while no numpy twin,
        release list or step-time cache exists (none has been asked for), what :meth:`commit`
        keeps current is only the lists, the scan and the limits."""
        if self._arrays or self._releases or self._tau_cache is not None:
            for call, p, d, delta in picks:
                self.commit(call, p, d, delta, True,
                            (call.pf_est if cache_aware else call.pf_cold)[p])
            return
        self._start_memo = None
        free_l, pf_tokens_l = self.free_l, self.pf_tokens_l
        tokens, count, ctx = self.dec_tokens_l, self.dec_count_l, self.dec_ctx_l
        scan, limits, now, log = self._scan, self._limits, self.now, self._pick_log
        t = self.tables
        capacity, max_batch = t.dec_capacity, t.max_batch_list
        kernel = kernels.commit_prefill_picks
        if kernel is not None:  # the loop below, compiled: the same objects and operations
            kept, self._limits = kernel(picks, cache_aware, free_l, pf_tokens_l, tokens, count,
                                        ctx, log, now, capacity, max_batch, scan is not None,
                                        limits)
            if not kept:
                self._scan = None
            return
        for call, p, d, delta in picks:
            free_l[p] += (call.pf_est if cache_aware else call.pf_cold)[p]
            pf_tokens_l[p] += call.l_in
            if scan is not None and not count[d] and tokens[d] <= 0.0:
                scan = None  # d was idle: it leaves its twins
            kv = call.kv_pred
            tokens[d] += kv
            count[d] += 1
            ctx[d] += call.ctx_share
            if limits is not None:
                slack = capacity[d] - tokens[d]
                limits = (slack if slack < limits[0] else limits[0],
                          limits[1] or count[d] >= max_batch[d])
            log.append((d, now + delta, float(kv)))
        self._scan, self._limits = scan, limits

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
        exclude = self._exclude
        for placed in (inst.inbound,) if self.skip_queued else (inst.inbound, inst.queued):
            for c in placed.values():
                if c.uid not in exclude:
                    rel.append((max(c.proj_release, now), float(c.kv_pred)))
        rel.extend([(when, kv) for dd, when, kv in self._pick_log if dd == d])
        rel.sort()
        self._releases[d] = rel
        return rel


_DERIVED_LIMITS = (None, None)


def decode_limits_python(capacity: list[float], tokens: list[float], count: list[int],
                         max_batch: list[int]) -> tuple[float, bool]:
    """(smallest ``capacity − tokens``, whether any ``count ≥ max_batch``) over the decode
    instances: the reference of the compiled ``decode_limits``."""
    return min(map(sub, capacity, tokens)), any(map(ge, count, max_batch))


_uid = attrgetter("uid")


def snapshot(tables: ClusterTables, now: float, loads: SchedulerLoads,
             decode: list[DecodeInstance], planned: list[Call], prefill_stage: bool,
             skip_queued: bool = False) -> PlanState:
    """Build Ŝ at ``now`` for planning ``planned`` (those calls hold no reservation in Ŝ) from
    the cluster's scheduler-visible ``loads`` (copied: Ŝ's commits never reach them).

    ``skip_queued`` (a ``plan_depth`` window that leaves calls out): no call still waiting for
    its prefill holds a reservation in Ŝ either, planned or not, as when every waiting call is
    planned: those left out queue behind the planned ones, so the planned calls' projections
    do not wait for them. O(P + D) from the loads' ``pf_qtokens`` and ``dec_q*`` sums."""
    if skip_queued:
        work = [0.0] * len(loads.pf_queued)
        pf_tokens = [a - b for a, b in zip(loads.pf_tokens, loads.pf_qtokens, strict=True)]
        tokens = [a - b for a, b in zip(loads.dec_pred, loads.dec_qpred, strict=True)]
        count = [a - b for a, b in zip(loads.dec_count, loads.dec_qcount, strict=True)]
        ctx = [a - b for a, b in zip(loads.dec_ctx, loads.dec_qctx, strict=True)]
        if not prefill_stage:  # the decode window's calls give up their reservations too
            for c in planned:
                d = c.decode_inst
                tokens[d] -= c.kv_pred
                count[d] -= 1
                ctx[d] -= c.ctx_share
        free = prefill_free_times(loads.pf_run_end, now, work)
        state = PlanState(tables, now, free, tokens, count, ctx, decode,
                          set(map(_uid, planned)), pf_tokens)
        state.skip_queued = True
        return state
    exclude = set(map(_uid, planned))
    work = loads.pf_queued[:]
    pf_tokens = loads.pf_tokens[:]
    tokens = loads.dec_pred[:]
    count = loads.dec_count[:]
    ctx = loads.dec_ctx[:]
    for c in planned:  # a call being (re-)planned gives up its current place in Ŝ
        if c.decode_inst >= 0:
            if prefill_stage:
                work[c.prefill_inst] -= c.pf_queued
                pf_tokens[c.prefill_inst] -= c.l_in
            d = c.decode_inst
            tokens[d] -= c.kv_pred
            count[d] -= 1
            ctx[d] -= c.ctx_share
    free = prefill_free_times(loads.pf_run_end, now, work)
    state = PlanState(tables, now, free, tokens, count, ctx, decode, exclude, pf_tokens)
    return state
