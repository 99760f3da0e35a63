"""Prefix caching: the block cache itself, hand-computed hits in the simulator, sample groups,
and the exact ideal reuse of a Mooncake-format replay."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hexagent_gym.cluster.cluster import load_cluster
from hexagent_gym.planning import kernels
from hexagent_gym.planning.decisions import earliest_finish_pick
from hexagent_gym.policy import make_policy, run_policy
from hexagent_gym.sim.prefix_cache import PrefixCache, match_levels
from hexagent_gym.sim.simulator import Simulator
from hexagent_gym.workload.arrivals import sample_episode
from hexagent_gym.workload.trace_formats import ideal_prefix_hit_rate
from hexagent_gym.workload.workload import load_trace
from tests.toy import ToyLatency, toy_cluster
from tests.toy import toy_episode as episode
from tests.toy import workflow_with_reuse as wf

LM = ToyLatency()
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"




# -- the cache on its own --------------------------------------------------------------------

def test_lru_evicts_the_least_recently_used_unlocked_leaf():
    cache = PrefixCache(capacity_tokens=3 * 10, block_tokens=10)
    held = cache.insert([1, 2], 0)  # a prefill of blocks 1, 2
    cache.unlock([1, 2], held)
    cache.unlock([3], cache.insert([3], 0))  # another prompt, block 3
    assert cache.blocks() == [2, 1, 3]  # leaf first, then its parent, then the newer prompt
    cache.unlock([1, 2], cache.lock([1, 2], -1))  # 1, 2 used again: 3 is now the oldest
    assert cache.blocks() == [3, 2, 1]
    cache.unlock([4], cache.insert([4], 0))
    assert cache.blocks() == [2, 1, 4] and cache.evictions == 1  # 3 went
    cache.unlock([5], cache.insert([5], 0))
    assert cache.blocks() == [1, 4, 5]  # 2 (a leaf) went before its parent 1
    assert cache.match([1, 2]) == 1


def test_locked_blocks_are_never_evicted_and_an_insert_stops_when_all_are_locked():
    cache = PrefixCache(capacity_tokens=2, block_tokens=1)
    held = cache.insert([1, 2], 0)
    assert held == 2 and cache.locked() == 2
    assert cache.insert([7, 8], 0) == 0  # nothing evictable: nothing inserted, nothing lost
    assert cache.blocks() == [2, 1]
    cache.unlock([1, 2], held)
    assert cache.insert([7, 8], 0) == 2 and set(cache.blocks()) == {7, 8}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 6), min_size=1, max_size=5), st.booleans()),
                min_size=1, max_size=40), st.integers(0, 6))
def test_cache_never_exceeds_capacity_and_matches_are_prefixes(ops, capacity):
    cache = PrefixCache(capacity_tokens=capacity * 16, block_tokens=16)
    live = []
    for raw, release in ops:
        blocks = [hash(tuple(raw[:i + 1])) for i in range(len(raw))]  # chained ids
        k = cache.match(blocks)
        assert 0 <= k <= len(blocks) and all(b in cache for b in blocks[:k])
        held = cache.insert(blocks, cache.lock(blocks, k))
        assert len(cache) <= capacity
        live.append((blocks, held))
        if release:
            for b, h in live:
                cache.unlock(b, h)
            live.clear()
    for b, h in live:
        cache.unlock(b, h)
    assert cache.locked() == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.lists(st.integers(0, 4), min_size=1, max_size=5),
                          st.booleans()), min_size=1, max_size=50), st.integers(0, 5))
def test_the_shared_index_gives_every_caches_match(ops, capacity):
    # four small caches (evictions happen) share one block index; after every operation the
    # index's match levels must equal each cache's own match, for every prompt seen so far
    holders: dict[int, int] = {}
    caches = [PrefixCache(capacity * 16, 16, holders, i) for i in range(4)]
    prompts, live = [], []
    for which, raw, release in ops:
        blocks = [hash(tuple(raw[:i + 1])) for i in range(len(raw))]
        prompts.append(blocks)
        cache = caches[which]
        live.append((cache, blocks, cache.insert(blocks, cache.lock(blocks, -1))))
        if release:
            for c, b, h in live:
                c.unlock(b, h)
            live.clear()
        for blocks in prompts:
            got = [0] * 4
            for k, mask in match_levels(holders, blocks):
                for i in range(4):
                    if mask >> i & 1:
                        assert got[i] == 0  # each cache in at most one level
                        got[i] = k
            assert got == [c.match(blocks) for c in caches]
    assert set(holders) == {b for c in caches for b in c.blocks()}


def _cache_state(caches, holders):
    return ([(c.blocks(), dict(c._refs), c.inserted, c.evictions) for c in caches],
            dict(holders))


def test_a_deep_copy_of_a_clusters_caches_is_exact_independent_and_shares_one_index():
    holders: dict[int, int] = {}
    caches = [PrefixCache(5 * 16, 16, holders, i) for i in range(2)]
    caches[0].insert([1, 2, 3], 0)  # still locked
    caches[1].unlock([1, 4], caches[1].insert([1, 4], 0))
    before = _cache_state(caches, holders)
    copies = copy.deepcopy(caches)
    assert copies[0].holders is copies[1].holders is not holders
    assert _cache_state(copies, copies[0].holders) == before
    for c in copies:  # evict and insert in the copies: the originals keep their state
        c.unlock([1, 2, 3], c.locked())
        c.insert([7, 8, 9, 10, 11], 0)
    assert _cache_state(caches, holders) == before
    assert _cache_state(copies, copies[0].holders) != before


@pytest.mark.skipif(not kernels.AVAILABLE, reason="the compiled kernels are not built")
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 4), min_size=1, max_size=6),
                          st.booleans(), st.booleans()), min_size=1, max_size=50),
       st.integers(0, 5))
def test_compiled_lock_insert_unlock_equal_python(ops, capacity):
    # the same operations on caches run by the compiled kernels and by the Python bodies leave
    # the same LRU order, lock counts, counters and shared index, and return the same counts
    runs = []
    try:
        for on in (True, False):
            kernels.use_compiled(on)
            holders: dict[int, int] = {}
            caches = [PrefixCache(capacity * 16, 16, holders, i) for i in range(3)]
            out, live = [], []
            for which, raw, touch, release in ops:
                blocks = tuple(hash(tuple(raw[:i + 1])) for i in range(len(raw)))
                cache = caches[which]
                k = cache.lock(blocks, -1, touch=touch)
                held = cache.insert(blocks, k)
                out.append((k, held))
                live.append((cache, blocks, held))
                if release:
                    for c, b, h in live:
                        c.unlock(b, h)
                    live.clear()
                out.append(_cache_state(caches, holders))
            runs.append(out)
    finally:
        kernels.use_compiled(True)
    assert runs[0] == runs[1]


@pytest.mark.skipif(not kernels.AVAILABLE, reason="the compiled kernels are not built")
def test_cache_kernels_by_hand_and_clear_errors():
    from collections import OrderedDict

    c = kernels._compiled
    lru, refs, holders = OrderedDict.fromkeys([1, 2, 3]), {}, {1: 1, 2: 1, 3: 1}
    # match [1, 2] (4 is absent), lock them leaf first with a touch: 3 becomes the oldest
    assert c.cache_lock(lru, refs, lru.move_to_end, [1, 2, 4], -1) == 2
    assert list(lru) == [3, 2, 1] and refs == {1: 1, 2: 1}
    # insert from block 2 (4 and 5 are new) into a cache of 4 blocks: 5 needs an eviction
    assert c.cache_insert(lru, refs, holders, 2, [1, 2, 4, 5], 2, 4, lru.move_to_end) == (
        3, 1, True)
    assert holders[4] == 2 and refs == {1: 1, 2: 1, 4: 1}
    del lru[3]  # the caller's eviction
    assert c.cache_insert(lru, refs, holders, 2, [1, 2, 4, 5], 3, 4, lru.move_to_end) == (
        4, 1, False)
    assert list(lru) == [5, 4, 2, 1] and refs == {1: 1, 2: 1, 4: 1, 5: 1}
    c.cache_unlock(refs, [1, 2, 4, 5], 2)
    assert refs == {4: 1, 5: 1}
    with pytest.raises(KeyError):
        c.cache_unlock(refs, [1], 1)
    with pytest.raises(TypeError, match="cache_lock takes 5 arguments, got 1"):
        c.cache_lock(lru)
    with pytest.raises(TypeError, match="cache_lock: lru must be a dict, got list"):
        c.cache_lock([], refs, None, [1], 1)
    with pytest.raises(TypeError, match="cache_insert: refs must be a dict, got list"):
        c.cache_insert(lru, [], None, 1, [1], 0, None, lru.move_to_end)
    with pytest.raises(ValueError, match="cache_insert: start = 3 is outside 0..1"):
        c.cache_insert(lru, refs, None, 1, [1], 3, None, lru.move_to_end)
    with pytest.raises(ValueError, match="cache_unlock: k = 2 is outside 0..1"):
        c.cache_unlock(refs, [1], 2)
    with pytest.raises(TypeError, match="blocks must be a list or tuple, got set"):
        c.cache_lock(lru, refs, None, {1}, 1)


# -- hits in the simulator ---------------------------------------------------------------------

def test_three_call_chain_hits_by_hand():
    # blocks of 100: call 0 holds [a0 a1 | partial]; call 1 shares 300 tokens of call 0's
    # input+output but only a0 a1 are cached (the prefill instance holds prompts only): 200;
    # call 2 extends call 1's 330-token prompt by its first 300 full-block tokens: 300.
    chain = wf([(250, 50, [], {}),
                (330, 50, [0], {"prefix_of": "0", "prefix_tokens": 300}),
                (420, 10, [1], {"prefix_of": "1", "prefix_tokens": 380})])
    sim = Simulator(toy_cluster(prefill_kv=10_000), episode(chain))
    res = sim.run()
    calls = sim.workflows[0].calls
    assert [c.hit for c in calls] == [0, 200, 300]
    for c in calls:
        assert c.prefill_end - c.prefill_start == pytest.approx(LM.prefill_time(c.l_in, c.hit))
    assert res.prefix_hit_rate == pytest.approx(500 / 1000)
    assert [c.spec.own_hit for c in calls] == [0, 200, 300]
    assert res.ratios[0] == pytest.approx(1.0, abs=1e-12)  # the horizon reuses the same prompts


def test_shared_template_fan_out_hits_by_hand():
    # every call starts with a 250-token static prefix shared across workflows (2 full blocks)
    t = {"shared_prefix_key": "tpl", "shared_prefix_tokens": 250}
    fan = wf([(300, 20, [], t), (320, 20, [0], t), (340, 20, [0], t), (360, 20, [0], t)], "fan")
    later = wf([(280, 20, [], t)], "later")
    sim = Simulator(toy_cluster(prefill_kv=10_000), episode(fan, later, arrivals=[0.0, 10.0]))
    res = sim.run()
    assert [c.hit for c in sim.workflows[0].calls] == [0, 200, 200, 200]
    assert sim.workflows[1].calls[0].hit == 200  # another workflow's template, still cached
    assert res.prefix_hit_rate == pytest.approx(800 / 1600)
    # alone on a cold cache the later workflow would have missed: it finished faster than H_w
    assert res.ratios[1] < 1.0 and res.faster_than_alone == pytest.approx(0.5)


def test_hit_depends_on_the_prefill_instance_chosen():
    chain = wf([(400, 10, [], {}), (500, 10, [0], {"prefix_of": "0", "prefix_tokens": 410})])

    def run(child_p: int) -> int:
        sim = Simulator(toy_cluster(prefill=(LM, LM), prefill_kv=10_000), episode(chain))

        def pick(dp):
            slot, _, d = earliest_finish_pick(dp)
            return slot, (0 if dp.calls[slot].index == 0 else child_p), d

        sim.run(pick)
        return sim.workflows[0].calls[1].hit

    assert run(0) == 400 and run(1) == 0


def test_cache_aware_fallback_places_the_child_where_its_prefix_is():
    # the second instance is free and as fast, but the first holds the child's prefix
    chain = wf([(2000, 10, [], {}), (2100, 10, [0], {"prefix_of": "0", "prefix_tokens": 2010})])
    sim = Simulator(toy_cluster(prefill=(LM, LM), prefill_kv=10_000), episode(chain))
    sim.run()
    calls = sim.workflows[0].calls
    assert calls[1].prefill_inst == calls[0].prefill_inst and calls[1].hit == 2000


def test_cache_off_prefills_everything():
    chain = wf([(250, 50, [], {}), (330, 50, [0], {"prefix_of": "0", "prefix_tokens": 300})])
    sim = Simulator(toy_cluster(prefill_kv=10_000), episode(chain), prefix_cache=False)
    res = sim.run()
    assert [c.hit for c in sim.workflows[0].calls] == [0, 0] and res.prefix_hit_rate == 0.0


def test_sample_group_prefills_once_and_shares_the_prompt_kv():
    g = {"sample_group": "e0"}
    group = wf([(1000, 10, [], g), (1000, 20, [], g), (1000, 30, [], g), (50, 5, [1], {})])
    # 1060 tokens hold the prompt once plus the three outputs; three copies would not fit
    sim = Simulator(toy_cluster(prefill_kv=10_000, capacity=1060), episode(group))
    res = sim.run()
    lead, r1, r2, child = sim.workflows[0].calls
    assert lead.prefill_end - lead.prefill_start == pytest.approx(LM.prefill_time(1000))
    assert r1.prefill_start == r2.prefill_start == lead.prefill_start
    assert r1.decode_start == r2.decode_start == lead.decode_start
    assert lead.finish_t < r1.finish_t < r2.finish_t  # samples end at their own lengths
    assert child.reveal_t == pytest.approx(r1.finish_t)  # the child waits for its own parent
    assert sim.decode[0].used_kv == 0 and res.prefix_hit_rate == pytest.approx(2000 / 3050)
    # served as three requests, three prompts' KV cannot share the instance: they decode in turn
    apart = Simulator(toy_cluster(prefill_kv=10_000, capacity=1060), episode(group),
                      parallel_sampling=False)
    apart.run()
    lead, r1, r2, _ = apart.workflows[0].calls
    assert lead.decode_start < r1.decode_start < r2.decode_start
    assert len({lead.prefill_start, r1.prefill_start, r2.prefill_start}) == 3


def test_sample_group_members_must_share_parents_and_prompt():
    with pytest.raises(ValueError, match=r"calls\[1\]\.sample_group"):
        wf([(1000, 10, [], {"sample_group": 1}), (900, 10, [], {"sample_group": 1})])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 900), st.integers(1, 50), st.integers(0, 3),
                          st.integers(0, 900), st.booleans()), min_size=1, max_size=8),
       st.integers(0, 12), st.integers(1, 3))
def test_random_dags_hit_at_most_the_prompt_and_fit_the_cache(rows, capacity_blocks, n_pre):
    calls = []
    for i, (n_in, n_out, back, reuse, group) in enumerate(rows):
        if group and calls:  # another sample of the previous call's request
            p_in, _, p_parents, p_extra = calls[-1]
            p_extra.setdefault("sample_group", f"g{i}")
            calls.append((p_in, n_out, p_parents, dict(p_extra)))
            continue
        parents = [i - 1 - back] if i - 1 - back >= 0 else []
        extra = {}
        if parents:
            extra = {"prefix_of": str(parents[0]), "prefix_tokens": min(reuse, n_in)}
        calls.append((n_in, n_out, parents, extra))
    flows = [wf(calls, f"w{k}", block=64) for k in range(3)]
    cluster = toy_cluster(prefill=(LM,) * n_pre, prefill_kv=capacity_blocks * 64)
    sim = Simulator(cluster, episode(*flows, arrivals=[0.0, 0.05, 0.1]))
    res = sim.run()
    for w in sim.workflows:
        for c in w.calls:
            assert 0 <= c.hit <= c.l_in
    assert all(len(c) <= capacity_blocks for c in sim.caches)
    assert all(c.locked() == 0 for c in sim.caches)
    assert all(d.used_kv == 0 for d in sim.decode)  # every sample group returned its prompt
    assert 0.0 <= res.prefix_hit_rate <= 1.0


def test_mooncake_replay_on_one_prefill_instance_reaches_the_ideal_reuse_exactly():
    trace = load_trace(FIXTURES / "mooncake_small.jsonl")
    cluster = load_cluster({
        "name": "one-prefill", "model": "llama-3.1-8b",
        "prefill": [{"gpu": "h100", "tp": 1}],
        "decode": [{"gpu": "h100", "tp": 1, "max_batch_size": 64}]})
    work = sample_episode(trace, None, np.random.default_rng(0), None)
    sim = Simulator(cluster, work, prefix_cache_tokens=math.inf)
    res = run_policy(sim, make_policy("fcfs"))
    ideal = ideal_prefix_hit_rate(trace.workflows)
    assert 0.2 < ideal < 0.9
    assert res.prefix_hit_rate == ideal


@pytest.mark.parametrize("trace,policy", [("bfcl_v3", "hexagent"), ("sharegpt", "hexagent"),
                                          ("lats", "fallback"), ("mixed", "fallback")])
def test_a_workflow_alone_meets_its_horizon_exactly_with_the_cache(trace, policy):
    # H_w is the workflow alone on a cold cache: served alone, with its own reuse, it takes H_w
    # (chains under HexAgent's earliest-finish placement; any DAG under the fallback)
    cluster = load_cluster("hetero-1")
    flows = load_trace(trace).workflows[:4]
    for spec in flows:
        sim = Simulator(cluster, episode(spec))
        res = run_policy(sim, make_policy(policy))
        assert res.ratios[0] == pytest.approx(1.0, abs=1e-12)
        if trace == "bfcl_v3":  # a ~6k-token multi-turn chain stays where its prompt is cached
            assert [c.hit for c in sim.workflows[0].calls] == [c.own_hit for c in spec.calls]
            assert res.prefix_hit_rate > 0.5


def test_kept_views_equal_fresh_views_at_every_prefill_decision():
    """A re-planned call keeps its cache view while the caches' match of its prompt is
    unchanged; at every prefill decision each waiting call's view must equal one built afresh."""
    from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
    from hexagent_gym.planning.decisions import Stage
    from hexagent_gym.policy import make_policy
    from hexagent_gym.sim.prefix_cache import cache_view

    sim = EpisodeFactory(EpisodeConfig(cluster="hetero-1-x2", trace="bfcl_v3",
                                       num_workflows=200, load=1.2, seed=3)).simulator()
    policy = make_policy("hexagent")
    policy.reset(sim)
    checked = with_hits = 0
    dp = sim.run_until_decision()
    while dp is not None:
        if dp.stage == Stage.PREFILL:
            for call in dp.calls:
                fresh = cache_view(sim.tables, sim.caches[0].holders, sim.block_tokens, call)
                assert (call.cached, call.pf_est) == fresh
                checked += 1
                with_hits += call.cached is not None
        while not dp.done:
            dp.pick(*policy.pick(dp))
        dp = sim.run_until_decision()
    assert checked > 500 and with_hits > 100
