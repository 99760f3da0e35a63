"""The core's placement rule: the pair with the earliest projected finish (scalar Python)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hexagent_gym.planning import kernels
from hexagent_gym.planning.cluster_tables import INF, mean_own_context

if TYPE_CHECKING:
    from hexagent_gym.planning.cluster_tables import ClusterTables
    from hexagent_gym.planning.entities import Call


def decode_terms(tables: ClusterTables, d: int, now: float, tokens: list[float],
                 count: list[int], ctx: list[float], weight: float, own_ctx: float, kv: float,
                 slow_start: Callable[[int, float, int], float]) -> tuple[float, float]:
    """One call on decode instance ``d`` under Ŝ: (earliest admission time, decode time − now).

    The decode time is ``weight · τ_d`` with the call joining d's committed batch at its mean
    own context ``own_ctx``; admission waits for ``kv`` reserved tokens and a batch slot. With
    :func:`decode_end` (its second term alone) the scalar home of this arithmetic (the
    fallback's rule and the scalar projections call them); the same operations as the numpy
    projections, so the floats agree."""
    cap, max_batch, base_row, slope_row = tables.dec_static[d]
    n = count[d]
    # decode_end's arithmetic, inlined: this is the fallback's innermost loop, where one more
    # call per decode instance cost the engine ≈ 5 % per call on 64P+64D (tested equal)
    top = tables.batch_top
    b = n + 1 if n < top else top
    slope = slope_row[b]
    end = weight * ((base_row[b] + slope * ctx[d]) + slope * own_ctx) - now
    need = (kv if kv < cap else cap) - (cap - tokens[d])
    start = now if need <= 0.0 and n < max_batch else slow_start(d, need, n - max_batch + 1)
    return start, end


def decode_end(tables: ClusterTables, d: int, now: float, count: list[int], ctx: list[float],
               weight: float, own_ctx: float) -> float:
    """The decode-time term of :func:`decode_terms` alone (decode time − now on ``d``): all a
    projection needs when no decode limit binds (the start is then ``now``)."""
    _, _, base_row, slope_row = tables.dec_static[d]
    n = count[d]
    top = tables.batch_top
    b = n + 1 if n < top else top
    slope = slope_row[b]
    return weight * ((base_row[b] + slope * ctx[d]) + slope * own_ctx) - now


def decode_scan(tables: ClusterTables, tokens: list[float], count: list[int],
                ctx: list[float]) -> list[int]:
    """:func:`decode_scan_python`, compiled when :mod:`hexagent_gym.planning.kernels` is built."""
    kernel = kernels.decode_scan
    if kernel is None:
        return decode_scan_python(tables, tokens, count, ctx)
    return kernel(tables.dec_kind, tokens, count, ctx)


def decode_scan_python(tables: ClusterTables, tokens: list[float], count: list[int],
                       ctx: list[float]) -> list[int]:
    """The decode instances a scalar placement must look at, ascending: every instance holding a
    committed call, and of each set of idle *twins* only the lowest index.

    Idle twins are instances of one kind (``tables.dec_kind``: latency model, KV capacity, batch
    limit and network column) with no committed call, no committed tokens (so no decode limit
    binds) and equal context sums. :func:`decode_terms` and the KV transfer give every call the
    same floats on each of them, so under any rule that breaks ties by the lowest decode index
    the others never win: skipping them changes no decision."""
    kind = tables.dec_kind
    scan = []
    idle = set()
    for d, n in enumerate(count):
        if n or tokens[d] > 0.0:
            scan.append(d)
        else:
            key = (kind[d], tokens[d], ctx[d])
            if key not in idle:
                idle.add(key)
                scan.append(d)
    return scan


def earliest_pair(tables: ClusterTables, now: float, free: list[float], tokens: list[float],
                  count: list[int], ctx: list[float], call: Call,
                  slow_start: Callable[[int, float, int], float],
                  scan: list[int] | None = None) -> tuple[int, int, float]:
    """:func:`earliest_pair_python`, compiled when :mod:`hexagent_gym.planning.kernels` is built
    (the same pair and the same float)."""
    kernel = kernels.earliest_pair
    if kernel is None:
        return earliest_pair_python(tables, now, free, tokens, count, ctx, call, slow_start, scan)
    cached = call.cached
    l_out = call.l_out_pred
    return kernel(now, free, tables.pf_members, tables.dec_static, tables.batch_top,
                  tables.dec_capacity, tables.setup_list, tables.spt_list,
                  decode_scan(tables, tokens, count, ctx) if scan is None else scan, tokens,
                  count, ctx, slow_start, call.pf_cls if cached is None else call.pf_est,
                  cached, tables.transfer_cols(call.l_in) if cached is None else None,
                  call.l_in, l_out * call.dec_err, mean_own_context(call.l_in, l_out),
                  call.kv_pred, call.kv_true)


def earliest_pair_python(tables: ClusterTables, now: float, free: list[float],
                         tokens: list[float], count: list[int], ctx: list[float], call: Call,
                         slow_start: Callable[[int, float, int], float],
                         scan: list[int] | None = None) -> tuple[int, int, float]:
    """The core's placement rule: the pair with the earliest projected finish Δ.

    Ties go to the lowest decode index, and within a decode instance to the prefill instance
    whose KV arrives first (then the lowest index). The arithmetic mirrors
    :meth:`PlanState.project_prefill` operation for operation, so the chosen pair's Δ equals that
    tensor's entry exactly. Scalar Python over classes and decode instances: at this size it
    beats numpy's per-call overhead several times.

    ``scan``: the decode instances to look at (default :func:`decode_scan` of the lists).

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
        xcols = _CandidateTransfers(tables, call.l_in, [p for _, p in cands])
    l_out = call.l_out_pred
    weight = l_out * call.dec_err
    own_ctx = mean_own_context(call.l_in, l_out)
    kv_pred, kv_true = call.kv_pred, call.kv_true
    capacity = tables.dec_capacity
    best, best_d, best_p = INF, -1, -1
    for d in decode_scan(tables, tokens, count, ctx) if scan is None else scan:
        if kv_true > capacity[d]:
            continue
        start, end = decode_terms(tables, d, now, tokens, count, ctx, weight, own_ctx, kv_pred,
                                  slow_start)
        a, ap = INF, -1
        for (val, p), x in zip(cands, xcols[d], strict=True):
            x = val + x  # KV arrival on d; earliest wins, lowest prefill index on ties
            if x < a or (x == a and p < ap):
                a, ap = x, p
        fin = (a if a > start else start) + end
        if fin < best:
            best, best_d, best_p = fin, d, ap
    return best_p, best_d, best


class _CandidateTransfers:
    """``xcols[d]``: the KV-transfer seconds from each candidate prefill instance to decode
    instance ``d``, computed on demand (no P × D table for a prompt length seen once)."""

    __slots__ = ("_rows", "_l_in")

    def __init__(self, tables: ClusterTables, l_in: int, cands: list[int]) -> None:
        self._rows = [(tables.setup_list[p], tables.spt_list[p]) for p in cands]
        self._l_in = l_in

    def __getitem__(self, d: int) -> list[float]:
        l_in = self._l_in
        return [setup[d] + l_in * spt[d] for setup, spt in self._rows]
