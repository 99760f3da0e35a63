"""Standalone horizons H_w: each workflow run alone on the empty cluster (docs/simulator.md).

H_w is the metric's denominator, so it uses true service times (no estimation error) and the
core's fallback placement (earliest projected finish) through the same simulator, which makes
C_w = H_w exactly (up to floating-point rounding) for a workflow served alone under the fallback.

A workflow alone on an empty cluster touches few instances, and untouched instances of one kind
(same speed, memory, batch limit and network rows) are twins: the fallback breaks ties by the
lowest index, so of the untouched members of a kind only the first can be chosen. If a run on the
cluster cut to the first ``m`` members of each kind never touches the last kept member of a cut
kind, the full cluster's run makes the same choices, so its result is bit for bit the full
cluster's. :class:`HorizonCache` runs each workflow on such a cut (``m`` = 4, doubled until the
check holds), which makes a horizon cost the same on 64 + 64 instances as on 8 + 8 (tested).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from hexagent_gym.planning.cluster_tables import ClusterTables
from hexagent_gym.planning.placement import decode_scan, earliest_pair
from hexagent_gym.sim.engine import Engine
from hexagent_gym.sim.prefix_cache import cache_view
from hexagent_gym.workload.arrivals import EpisodeWorkload

if TYPE_CHECKING:
    from hexagent_gym.cluster.cluster import ClusterSpec
    from hexagent_gym.planning.entities import Workflow
    from hexagent_gym.workload.specs import CallSpec
    from hexagent_gym.workload.workload import WorkflowSpec


class HorizonCache:
    """Memoised standalone completion times per workflow spec on one cluster.

    Keyed by object identity: traces are immutable and cached by the loader, so the same spec
    objects recur across episodes; the cache holds a reference to keep each key alive.
    """

    def __init__(self, cluster: ClusterSpec, tables: ClusterTables | None = None, *,
                 prefix_cache: bool = True, prefix_cache_tokens: float | None = None,
                 parallel_sampling: bool = True) -> None:
        self.cluster = cluster
        self.tables = tables if tables is not None else ClusterTables(cluster)
        self.serving = {"prefix_cache": prefix_cache, "prefix_cache_tokens": prefix_cache_tokens,
                        "parallel_sampling": parallel_sampling}
        self._cache: dict[int, tuple[WorkflowSpec, float]] = {}
        self._kinds = _instance_kinds(cluster)
        self._widest = max(len(members) for kinds in self._kinds for members in kinds.values())
        self._sub: dict[int, tuple[ClusterSpec, ClusterTables]] = {}

    def get(self, spec: WorkflowSpec) -> float:
        """H_w of one workflow in seconds (computed once per spec)."""
        hit = self._cache.get(id(spec))
        if hit is not None and hit[0] is spec:
            return hit[1]
        value = self._standalone(spec)
        self._cache[id(spec)] = (spec, value)
        return value

    def _standalone(self, spec: WorkflowSpec) -> float:
        serving = self.serving
        if _replayable(self.cluster, spec, serving["prefix_cache"],
                       serving["prefix_cache_tokens"]):
            return _chain_time(self.tables, spec, serving["prefix_cache"])
        m = _FIRST_CUT
        while m < self._widest:
            sub, tables, last_p, last_d = self._cut(m)
            wf = _standalone_run(sub, spec, tables, **serving)
            if not (last_p & {c.prefill_inst for c in wf.calls}
                    or last_d & {c.decode_inst for c in wf.calls}):
                return wf.finish_t  # the cut never mattered: exact
            m *= 2
        return _simulated_time(self.cluster, spec, self.tables, **serving)

    def _cut(self, m: int) -> tuple[ClusterSpec, ClusterTables, set[int], set[int]]:
        """The cluster cut to the first ``m`` members of each kind, its tables and the indices
        (in the cut) of the last kept member of every kind that lost members (cached)."""
        hit = self._sub.get(m)
        if hit is None:
            pre_kinds, dec_kinds = self._kinds
            keep_p = sorted(i for members in pre_kinds.values() for i in members[:m])
            keep_d = sorted(i for members in dec_kinds.values() for i in members[:m])
            last_p = {keep_p.index(ms[m - 1]) for ms in pre_kinds.values() if len(ms) > m}
            last_d = {keep_d.index(ms[m - 1]) for ms in dec_kinds.values() if len(ms) > m}
            sub = _restrict(self.cluster, keep_p, keep_d)
            hit = (sub, ClusterTables(sub), last_p, last_d)
            self._sub[m] = hit
        return hit

    def __len__(self) -> int:
        return len(self._cache)


def _replayable(cluster: ClusterSpec, spec: WorkflowSpec, prefix_cache: bool,
                prefix_cache_tokens: float | None) -> bool:
    """Whether :func:`_chain_time` gives this workflow's horizon exactly: a chain and, with
    caching on, one whose distinct prompt blocks fit in every prefill cache (nothing is evicted;
    the caches sized as :func:`~hexagent_gym.sim.serving.build_caches` sizes them)."""
    if not _is_chain(spec):
        return False
    if not prefix_cache:
        return True
    if prefix_cache_tokens is not None:
        tokens = float(prefix_cache_tokens)
    else:
        sizes = [inst.kv_capacity_tokens for inst in cluster.prefill]
        tokens = float("inf") if any(x is None for x in sizes) else float(min(sizes))
    return tokens == float("inf") or (len({b for c in spec.calls for b in c.blocks})
                                      <= tokens // spec.block_tokens)


def standalone_time(cluster: ClusterSpec, spec: WorkflowSpec,
                    tables: ClusterTables | None = None, *, prefix_cache: bool = True,
                    prefix_cache_tokens: float | None = None,
                    parallel_sampling: bool = True) -> float:
    """Completion time of ``spec`` arriving at t = 0 on the empty cluster, served alone (with a
    cold prefix cache: only the workflow's own earlier prompts can hit)."""
    tables = tables if tables is not None else ClusterTables(cluster)
    if _replayable(cluster, spec, prefix_cache, prefix_cache_tokens):
        return _chain_time(tables, spec, prefix_cache)
    return _simulated_time(cluster, spec, tables, prefix_cache=prefix_cache,
                           prefix_cache_tokens=prefix_cache_tokens,
                           parallel_sampling=parallel_sampling)


_FIRST_CUT = 4  # members kept per kind on the first try (most workflows touch one or two)


def _instance_kinds(cluster: ClusterSpec) -> tuple[dict, dict]:
    """Instances grouped by kind, members in index order: equal latency model, KV capacity,
    batch limit and transfer rows (so an empty instance of a kind is any other's twin)."""
    setup, spt = cluster.transfer_setup_s, cluster.transfer_s_per_token
    pre: dict = {}
    for p, inst in enumerate(cluster.prefill):
        key = (id(inst.latency), inst.kv_capacity_tokens, setup[p].tobytes(), spt[p].tobytes())
        pre.setdefault(key, []).append(p)
    dec: dict = {}
    for d, inst in enumerate(cluster.decode):
        key = (id(inst.latency), inst.kv_capacity_tokens, inst.max_batch_size,
               setup[:, d].tobytes(), spt[:, d].tobytes())
        dec.setdefault(key, []).append(d)
    return pre, dec


def _restrict(cluster: ClusterSpec, keep_p: list[int], keep_d: list[int]) -> ClusterSpec:
    """The cluster with only the listed prefill and decode instances (order kept)."""
    rows, cols = np.asarray(keep_p), np.asarray(keep_d)
    return replace(cluster, prefill=tuple(cluster.prefill[p] for p in keep_p),
                   decode=tuple(cluster.decode[d] for d in keep_d),
                   transfer_setup_s=cluster.transfer_setup_s[np.ix_(rows, cols)],
                   transfer_s_per_token=cluster.transfer_s_per_token[np.ix_(rows, cols)],
                   transfer_bandwidth_gbs=cluster.transfer_bandwidth_gbs[np.ix_(rows, cols)])


def _is_chain(spec: WorkflowSpec) -> bool:
    calls = spec.calls
    return all(c.parents == ((i - 1,) if i else ()) for i, c in enumerate(calls))


def _chain_time(tables: ClusterTables, spec: WorkflowSpec, prefix_cache: bool = False) -> float:
    """A chain runs one call at a time on an idle cluster, so the simulation reduces to a sum.

    This replays the simulator's own arithmetic step by step (same placement function, same
    additions on the absolute clock, the decode clock of an idle instance starting at 0), so it
    returns bit-for-bit what the event loop would; ``tests/core/test_horizon.py`` checks it.

    With ``prefix_cache`` the replay also keeps which prefill instances hold each of the
    workflow's prompt blocks (the caches' shared index): a call sees its own earlier prompts as
    the scheduler's view does (``prefix_cache.cache_view``), is placed by the same rule, and its
    prefill takes the time of the prompt minus the blocks its instance holds. Exact only while
    nothing is evicted, which the caller checks (the workflow's blocks fit in every cache).
    """
    P, D = tables.num_prefill, tables.num_decode
    zeros_f, zeros_i = [0.0] * D, [0] * D
    scan = decode_scan(tables, zeros_f, zeros_i, zeros_f)  # the idle cluster's, every call's
    holders: dict[int, int] = {}  # block id -> bit mask of the prefill instances holding it
    block = spec.block_tokens
    cls = tables.pf_class_list
    now = 0.0
    for i, cs in enumerate(spec.calls):
        if i:
            now = now + cs.tool_latency_s
        call = _Replayed(cs, *tables.prefill_times(cs.input_tokens))
        if prefix_cache:
            call.cached, call.pf_est = cache_view(tables, holders, block, call)
        p, d, _ = earliest_pair(tables, now, [now] * P, zeros_f, zeros_i, zeros_f, call,
                                _never_binds, scan)
        if prefix_cache:  # as the engine's prefill start: the blocks p holds, capped at L_in
            hit = call.cached[p] if call.cached is not None else 0
            now = now + tables.prefill_times_hit(cs.input_tokens, hit)[cls[p]]
            bit = 1 << p
            for b in cs.blocks:  # the prefill's end inserts the prompt on p
                holders[b] = holders.get(b, 0) | bit
        else:
            now = now + call.pf_true[p]
        now = now + (tables.setup_list[p][d] + cs.input_tokens * tables.spt_list[p][d])
        v_finish = 0.0 + cs.output_tokens
        ctx = (0.0 + (cs.input_tokens + 0.5 * v_finish - 0.0)) + 1 * (0.0 - 1.0) * 0.5
        step = tables.cluster.decode[d].latency.decode_step_time(1, ctx)
        now = now + (v_finish - 0.0) * step
    return now


class _Replayed:
    """A call as :func:`_chain_time` replays it: the fields that the placement rule
    (:func:`~hexagent_gym.planning.placement.earliest_pair`) and the cache view read, equal to those
    of a :class:`~hexagent_gym.planning.entities.Call` of the same spec with no estimation error and
    its true output length as the prediction (tested); cheaper to build than a full Call, which a
    replay would build per call (docs/performance.md)."""

    __slots__ = ("spec", "l_in", "l_out_pred", "kv_true", "kv_pred", "pf_err", "dec_err",
                 "pf_true", "pf_cls", "pf_cold", "pf_est", "cached")

    def __init__(self, cs: CallSpec, pf_true: tuple[float, ...],
                 pf_cls: tuple[float, ...]) -> None:
        self.spec = cs
        self.l_in = cs.input_tokens
        self.l_out_pred = cs.output_tokens
        self.kv_true = self.kv_pred = cs.input_tokens + cs.output_tokens
        self.pf_err = self.dec_err = 1.0
        self.pf_true = self.pf_est = self.pf_cold = pf_true
        self.pf_cls = pf_cls
        self.cached: tuple[int, ...] | None = None


def _never_binds(d: int, need: float, over: int) -> float:
    raise AssertionError("an empty cluster cannot bind a decode limit for a call that fits")


def _simulated_time(cluster: ClusterSpec, spec: WorkflowSpec, tables: ClusterTables,
                    **serving) -> float:
    return _standalone_run(cluster, spec, tables, **serving).finish_t


def _standalone_run(cluster: ClusterSpec, spec: WorkflowSpec, tables: ClusterTables,
                    **serving) -> Workflow:
    """The workflow of :func:`_simulation`, its simulator closed (freed now, not by a later
    collection; the workflow's calls, finish time and placements stay readable)."""
    sim = _simulation(cluster, spec, tables, **serving)
    wf = sim.workflows[0]
    sim.close()
    return wf


def _simulation(cluster: ClusterSpec, spec: WorkflowSpec, tables: ClusterTables,
                **serving) -> Engine:
    """The finished standalone run of ``spec`` (fallback placement, no horizons of its own)."""
    workload = EpisodeWorkload((spec,), np.zeros(1), np.zeros(1, dtype=np.int64))
    sim = Engine(cluster, workload, decisions=False, tables=tables, **serving)
    sim.run_until_decision()
    return sim
