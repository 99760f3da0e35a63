"""Standalone horizons: the chain shortcut equals the event loop bit for bit."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hexagent_gym.cluster.cluster import load_cluster
from hexagent_gym.planning.cluster_tables import ClusterTables
from hexagent_gym.sim.horizon import (
    HorizonCache,
    _chain_time,
    _is_chain,
    _replayable,
    _simulated_time,
    standalone_time,
)
from hexagent_gym.workload.workload import load_trace, make_workflow
from tests.toy import ToyLatency, toy_cluster, workflow_with_reuse

lat = st.builds(ToyLatency, a=st.floats(0.001, 0.05), b=st.floats(1e-5, 5e-4),
                c=st.floats(0.002, 0.05), e=st.floats(0.0, 2e-3), f=st.floats(0.0, 5e-6))


@settings(max_examples=60, deadline=None)
@given(st.lists(lat, min_size=1, max_size=3), st.lists(lat, min_size=1, max_size=3),
       st.lists(st.tuples(st.integers(1, 4000), st.integers(1, 300),
                          st.sampled_from([0.0, 0.2, 0.89])), min_size=1, max_size=8))
def test_chain_shortcut_matches_the_simulation_exactly(pre, dec, steps):
    cluster = toy_cluster(prefill=tuple(pre), decode=tuple(dec), capacity=10_000)
    chain = make_workflow([(i, o, t, [k - 1] if k else []) for k, (i, o, t) in enumerate(steps)])
    tables = ClusterTables(cluster)
    assert _chain_time(tables, chain) == _simulated_time(cluster, chain, tables)


@settings(max_examples=60, deadline=None)
@given(st.lists(lat, min_size=1, max_size=3), st.lists(lat, min_size=1, max_size=3),
       st.lists(st.tuples(st.integers(1, 4000), st.integers(1, 300),
                          st.sampled_from([0.0, 0.2]), st.booleans()), min_size=1, max_size=8),
       st.sampled_from([16, 64]))
def test_cached_chain_shortcut_matches_the_simulation_exactly(pre, dec, steps, block):
    # multi-turn reuse: a call's prompt starts with its parent's prompt and output, so the
    # instance that served the parent holds part of it; caches big enough to never evict
    calls = []
    for k, (n_in, n_out, _tool, reuse) in enumerate(steps):
        extra = {}
        if k and reuse:
            prev_in, prev_out = steps[k - 1][:2]
            n_in = max(n_in, prev_in + prev_out)
            extra = {"prefix_of": str(k - 1), "prefix_tokens": prev_in + prev_out}
        calls.append((n_in, n_out, [k - 1] if k else [], extra))
    chain = workflow_with_reuse(calls, block=block)
    chain = replace(chain, calls=tuple(replace(c, tool_latency_s=t) if k else c
                                       for k, (c, (_, _, t, _)) in enumerate(
                                           zip(chain.calls, steps, strict=True))))
    cluster = toy_cluster(prefill=tuple(pre), decode=tuple(dec), capacity=50_000,
                          prefill_kv=10**6)
    tables = ClusterTables(cluster)
    assert _chain_time(tables, chain, True) == _simulated_time(cluster, chain, tables)
    assert standalone_time(cluster, chain, tables) == _simulated_time(cluster, chain, tables)


@pytest.mark.parametrize("cluster_name", ["hetero-1", "hetero-1-x4", "qwen-hetero-1"])
def test_cached_chain_shortcut_matches_the_simulation_on_real_traces(cluster_name):
    cluster = load_cluster(cluster_name)
    tables = ClusterTables(cluster)
    checked = hits = 0
    for trace in ("bfcl_v3", "sharegpt", "agent_sessions"):
        chains = [w for w in load_trace(trace).workflows if _is_chain(w)][:40]
        for spec in chains:
            assert _chain_time(tables, spec, True) == _simulated_time(cluster, spec, tables)
            checked += 1
            hits += any(c.own_hit for c in spec.calls)
    assert checked == 120 and hits > 40  # most of them reuse their own earlier prompts


def test_chains_that_could_evict_are_simulated():
    # a cache of 2 blocks cannot hold a 3-call chain's prompts: the shortcut is not taken
    lm = ToyLatency()
    cluster = toy_cluster(prefill=(lm, lm), decode=(lm,), prefill_kv=128)
    chain = workflow_with_reuse([(100, 30, [], {}),
                                 (180, 30, [0], {"prefix_of": "0", "prefix_tokens": 130}),
                                 (260, 30, [1], {"prefix_of": "1", "prefix_tokens": 210})],
                                block=64)
    assert not _replayable(cluster, chain, True, None)
    assert _replayable(cluster, chain, True, 10**6) and _replayable(cluster, chain, False, None)
    cache = HorizonCache(cluster)
    assert cache.get(chain) == _simulated_time(cluster, chain, cache.tables)


def test_one_call_horizon_is_hand_computable():
    lm = ToyLatency()
    cluster = toy_cluster(prefill=(lm,), decode=(lm,), setup=0.002, s_per_token=2e-6)
    wf = make_workflow([(1000, 100, 0.0, []), (200, 10, 0.5, [0])])
    first = lm.prefill_time(1000) + 0.002 + 1000 * 2e-6 + 100 * lm.decode_step_time(1, 1049.5)
    second = lm.prefill_time(200) + 0.002 + 200 * 2e-6 + 10 * lm.decode_step_time(1, 204.5)
    assert np.isclose(standalone_time(cluster, wf), first + 0.5 + second, rtol=1e-12)


def test_parallel_branches_overlap_in_the_horizon():
    lm = ToyLatency()
    cluster = toy_cluster(prefill=(lm, lm), decode=(lm, lm))
    single = make_workflow([(1000, 100, 0.0, [])])
    pair = make_workflow([(1000, 100, 0.0, []), (1000, 100, 0.0, [])])
    # two independent calls on two identical pairs take as long as one
    assert np.isclose(standalone_time(cluster, pair), standalone_time(cluster, single))


def test_cache_computes_each_spec_once():
    cluster = toy_cluster()
    cache = HorizonCache(cluster)
    wf = make_workflow([(100, 10, 0.0, [])])
    h = cache.get(wf)
    assert cache.get(wf) == h and len(cache) == 1


@pytest.mark.parametrize("trace", ["lats", "bfcl_v3", "mixed"])
def test_sub_cluster_horizons_equal_the_full_cluster_bit_for_bit(trace):
    # fan-outs, sample groups and prompt reuse on 32 + 32 instances: the cache runs each workflow
    # on the first m members of each kind and must return the full cluster's float exactly
    cluster = load_cluster("hetero-1-x4")
    tables = ClusterTables(cluster)
    cache = HorizonCache(cluster, tables)
    specs = load_trace(trace).workflows
    picked = sorted(specs, key=lambda w: -len(w.calls))[:4] + list(specs[:6])
    for spec in picked:  # against the full cluster's simulation
        assert cache.get(spec) == _simulated_time(cluster, spec, tables)
    if any(not _is_chain(spec) for spec in picked):  # (chains take the chain shortcut)
        assert min(len(sub.prefill) for sub, *_ in cache._sub.values()) == 12  # 4 per kind



def test_filled_horizons_are_the_ones_episodes_compute_on_arrival():
    from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
    config = EpisodeConfig(cluster="hetero-1", trace="agent_sessions", num_workflows=20,
                           load=1.0, seed=3)
    filled = EpisodeFactory(config)
    assert len(filled.horizons) == 0
    assert filled.fill_horizons() == len(filled.trace.workflows) == len(filled.horizons)
    lazy = EpisodeFactory(config)
    sim = lazy.simulator()
    sim.run()
    assert 0 < len(lazy.horizons) < len(filled.horizons)
    for wf in sim.workflows:  # the same float as the arrival computed, and no new entry
        assert filled.horizons.get(wf.spec) == wf.horizon
    assert filled.fill_horizons() == len(filled.trace.workflows)


def test_a_replayed_call_reads_as_the_call_it_stands_for():
    """_chain_time's light stand-in holds, for every field the placement rule and the cache
    view read, what a full Call of the same spec holds (no estimation error, the true output
    length as the prediction, the cold prefill times), for every call of a trace's chains."""
    from hexagent_gym.cluster.cluster import load_cluster
    from hexagent_gym.planning.cluster_tables import ClusterTables
    from hexagent_gym.planning.entities import Call
    from hexagent_gym.sim.horizon import _Replayed
    from hexagent_gym.workload.workload import load_trace

    tables = ClusterTables(load_cluster("hetero-1"))
    checked = 0
    for spec in load_trace("bfcl_v3").workflows[:40]:
        for i, cs in enumerate(spec.calls):
            full = Call(i, None, i, cs, cs.output_tokens, 1.0, 1.0)
            full.pf_true, full.pf_cls = tables.prefill_times(cs.input_tokens)
            full.pf_est = full.pf_cold = full.pf_true
            light = _Replayed(cs, *tables.prefill_times(cs.input_tokens))
            for name in _Replayed.__slots__:
                assert getattr(light, name) == getattr(full, name), name
            checked += 1
    assert checked > 100
