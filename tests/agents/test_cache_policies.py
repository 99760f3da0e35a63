"""Prefix-cache-aware policies on hand-built cases: sglang-router, ATLAS program locality and
HexAgent with and without cache-aware prefill estimates.

The cases run on tiny-2p2d (prefill 0 = A100, prefill 1 = H100) with a workflow whose children
extend the parent's prompt (``prefix_of``): once the parent's prefill has run on an instance, its
blocks sit in that instance's prefix cache, so a child hits there and nowhere else.
"""

from __future__ import annotations

import numpy as np
import pytest

import hexagent_gym
from hexagent_gym.agents.baselines import ATLAS_OVERLOAD_TOKENS, Atlas, CallFCFS
from hexagent_gym.agents.cache_aware import (
    SGL_BALANCE_ABS_THRESHOLD,
    SGL_BALANCE_REL_THRESHOLD,
    SGL_CACHE_THRESHOLD,
    SGLangRouter,
)
from hexagent_gym.agents.hexagent import HexAgentNoCache, HexAgentPolicy
from hexagent_gym.cluster.cluster import load_cluster
from hexagent_gym.planning.decisions import Stage, earliest_finish_pick
from hexagent_gym.policy import make_policy, policy_names, run_policy
from hexagent_gym.sim.simulator import Simulator
from hexagent_gym.workload.arrivals import EpisodeWorkload
from hexagent_gym.workload.workload import parse_workflow

PARENT_IN, CHILD_IN = 4000, 4200


def fan_out(children: int):
    """Call "a" and ``children`` calls after it, each extending a's prompt and answer."""
    calls = [{"id": "a", "parents": [], "input_tokens": PARENT_IN, "output_tokens": 50,
              "tool_latency_s": 0.0}]
    calls += [{"id": f"b{i}", "parents": ["a"], "input_tokens": CHILD_IN, "output_tokens": 50,
               "tool_latency_s": 0.0, "prefix_of": "a", "prefix_tokens": PARENT_IN + 50}
              for i in range(children)]
    return parse_workflow({"workflow_id": "fan", "calls": calls})


def children_decision(children: int = 1, parent_p: int = 1):
    """Run the parent with its prefill on ``parent_p`` and stop at the children's first prefill
    decision (both prefill instances idle by then)."""
    wf = fan_out(children)
    sim = Simulator(load_cluster("tiny-2p2d"), EpisodeWorkload((wf,), np.zeros(1), np.arange(1)))
    while True:
        dp = sim.run_until_decision()
        assert dp is not None
        if dp.stage == Stage.PREFILL and dp.calls[0].index > 0:
            assert len(dp.calls) == children
            return sim, dp
        while not dp.done:
            slot, p, d = earliest_finish_pick(dp)
            dp.pick(slot, parent_p if dp.stage == Stage.PREFILL else p, d)


def place_all(sim, dp, policy):
    policy.reset(sim)
    placed = []
    while not dp.done:
        slot, p, d = policy.pick(dp)
        dp.pick(slot, p, d)
        placed.append(p)
    return placed


def test_the_child_hits_only_where_the_parent_ran():
    _, dp = children_decision(parent_p=1)
    assert dp.cached[0, 0] == 0 and 0.5 < dp.cached[0, 1] / CHILD_IN < 1.0
    assert dp.state.pf_tokens.tolist() == [0.0, 0.0]


def test_new_policies_are_registered():
    assert {"hexagent-nocache", "sglang-router", "atlas"} <= set(policy_names())
    nocache = make_policy("hexagent-nocache")
    assert isinstance(nocache, HexAgentNoCache) and not nocache.cache_aware
    assert nocache.name == "hexagent-nocache"
    assert HexAgentPolicy(cache_aware=False).name == "hexagent-nocache"
    assert HexAgentPolicy().name == "hexagent" and HexAgentPolicy().cache_aware
    router = make_policy("sglang-router")
    assert isinstance(router, SGLangRouter)
    assert (router.cache_threshold, router.balance_abs_threshold,
            router.balance_rel_threshold) == (0.5, 32, 1.0001)
    assert (SGL_CACHE_THRESHOLD, SGL_BALANCE_ABS_THRESHOLD, SGL_BALANCE_REL_THRESHOLD) == (
        0.5, 32, 1.0001)
    atlas = make_policy("atlas")
    assert atlas.locality and atlas.overload_tokens == ATLAS_OVERLOAD_TOKENS == 16384
    with pytest.raises(ValueError, match="on_miss"):
        SGLangRouter(on_miss="random")
    with pytest.raises(ValueError, match="balance_rel_threshold"):
        SGLangRouter(balance_rel_threshold=0.5)
    with pytest.raises(ValueError, match="overload_tokens"):
        Atlas(overload_tokens=-1)


# -- sglang-router --------------------------------------------------------------------------------
def test_sglang_router_follows_the_prefix_when_balanced():
    sim, dp = children_decision(parent_p=1)
    assert place_all(sim, dp, SGLangRouter()) == [1]  # match 3584/4200 > 0.5 on prefill 1
    sim, dp = children_decision(parent_p=1)
    assert place_all(sim, dp, CallFCFS()) == [0]  # least-loaded alone rotates to prefill 0


def test_sglang_router_goes_least_loaded_when_imbalanced():
    # 40 siblings share the prefix on prefill 1: the router stacks them there until that
    # instance holds more than 32 calls beyond the other, then sends the next one away
    sim, dp = children_decision(children=40, parent_p=1)
    router = SGLangRouter()
    placed = place_all(sim, dp, router)
    assert placed[:33] == [1] * 33
    assert placed[33] == 0  # loads (33, 0): 33 − 0 > 32 and 33 > 1.0001 · 0
    assert placed[34] == 1  # loads (33, 1): a gap of 32 is balanced again: back to the prefix
    assert router.imbalanced(np.array([34.0, 1.0])) and not router.imbalanced(np.array([33., 1.]))
    # both conditions are needed: a large absolute gap with max <= rel · min is balanced
    assert not SGLangRouter(balance_rel_threshold=2.0).imbalanced(np.array([100.0, 60.0]))


def test_sglang_router_counts_queued_calls_outside_the_window_only():
    sim, dp = children_decision(children=3, parent_p=1)
    router = SGLangRouter()
    router.reset(sim)
    assert router.loads(dp).tolist() == [0.0, 0.0]
    dp.pick(*router.pick(dp))
    assert router.loads(dp).tolist() == [0.0, 1.0]  # this decision's pick counts
    with pytest.raises(RuntimeError, match="reset"):
        SGLangRouter().pick(dp)


def test_sglang_router_below_the_threshold_takes_the_smallest_cache():
    # the parent ran on prefill 0; a threshold above the child's match ratio (0.85) makes it a
    # miss: sgl-router then takes the smallest tree (prefill 1 caches nothing), not prefill 0
    sim, dp = children_decision(parent_p=0)
    assert place_all(sim, dp, SGLangRouter(cache_threshold=0.9)) == [1]
    sim, dp = children_decision(parent_p=0)
    assert place_all(sim, dp, SGLangRouter(cache_threshold=0.9, on_miss="least-loaded")) == [0]
    sim, dp = children_decision(parent_p=0)
    assert place_all(sim, dp, SGLangRouter()) == [0]  # a hit above 0.5: the prefix's instance


# -- ATLAS program locality ---------------------------------------------------------------------
def test_atlas_sends_a_call_to_its_programs_last_prefill_instance():
    sim, dp = children_decision(parent_p=1)
    assert dp.calls[0].workflow.last_prefill == 1
    assert place_all(sim, dp, Atlas()) == [1]
    sim, dp = children_decision(parent_p=1)
    assert place_all(sim, dp, Atlas(locality=False)) == [0]  # least-loaded rotation


def test_atlas_leaves_an_overloaded_home_instance():
    # 10 siblings of 4200 tokens: home (prefill 1) takes 4 (16800 tokens queued); the 5th would
    # find home 16800 > 16384 tokens above the idle prefill 0 and goes there; then home again
    sim, dp = children_decision(children=10, parent_p=1)
    placed = place_all(sim, dp, Atlas())
    assert placed[:5] == [1, 1, 1, 1, 0]
    assert placed[5:] == [1, 0, 1, 0, 1]
    sim, dp = children_decision(children=10, parent_p=1)
    assert place_all(sim, dp, Atlas(overload_tokens=1e9)) == [1] * 10


# -- HexAgent with and without cache-aware estimates --------------------------------------------
def test_hexagent_nocache_projects_cold_prefill_times():
    _, warm = children_decision(parent_p=1)
    _, cold = children_decision(parent_p=1)
    call = warm.calls[0]
    HexAgentPolicy().pick(warm)
    HexAgentNoCache().pick(cold)
    np.testing.assert_allclose(cold.batch.pf[0], cold.calls[0].pf_cold)
    np.testing.assert_allclose(warm.batch.pf[0], call.pf_est)
    assert warm.batch.pf[0, 1] < call.pf_cold[1] and warm.batch.pf[0, 0] == call.pf_cold[0]
    # Δ differs exactly by the cached part of the prefill, and only on the hit instance
    gap = cold.delta[0] - warm.delta[0]
    np.testing.assert_allclose(gap[0], 0.0, atol=1e-12)
    np.testing.assert_allclose(gap[1], call.pf_cold[1] - call.pf_est[1], rtol=1e-9)
    assert np.array_equal(cold.cached, warm.cached)  # the cache itself is the same


def test_hexagent_nocache_places_at_the_cold_argmin():
    _, dp = children_decision(parent_p=1)
    slot, p, d = HexAgentNoCache().pick(dp)
    row = dp.delta[slot]
    assert (p, d) == divmod(int(np.argmin(row)), row.shape[1])


@pytest.mark.parametrize("children, first", [
    (1, lambda dp: dp.delta), (1, lambda dp: dp.min_delta), (1, lambda dp: dp.best_pair(0)),
    (2, lambda dp: dp.best_pair(1)), (2, lambda dp: dp.min_delta),
], ids=["delta", "min_delta", "best_pair", "window-best_pair", "window-min_delta"])
def test_ignore_cache_after_the_first_projection_is_refused(children, first):
    # however the first projection was built (tensor, class reduction, scalar pair), it was
    # built cache-aware: switching the view afterwards would mix the two
    _, dp = children_decision(children, parent_p=1)
    first(dp)
    with pytest.raises(RuntimeError, match="ignore_cache"):
        HexAgentNoCache().pick(dp)


# -- whole episodes -------------------------------------------------------------------------------
@pytest.mark.parametrize("name, kwargs", [
    ("hexagent-nocache", {}), ("sglang-router", {}), ("sglang-router", {"on_miss": "least-loaded"}),
    ("atlas", {}), ("atlas", {"locality": False}),
])
def test_new_policies_finish_a_bfcl_episode(name, kwargs):
    env = hexagent_gym.make(cluster="hetero-1", trace="bfcl_v3", num_workflows=30, seed=0,
                            load=1.5).unwrapped
    sim = env.factory.simulator(env.episode_seed_for(0))
    res = run_policy(sim, make_policy(name, **kwargs))
    assert res.num_workflows == 30 and len(sim.finished) == 30
    assert all(wf.num_done == len(wf.calls) for wf in sim.finished)
    # a workflow can beat its standalone horizon slightly: other workflows' shared prompt
    # prefixes (templates) may already be cached, which a cold standalone run cannot reuse
    assert np.all(np.isfinite(res.ratios)) and np.all(res.ratios > 0.9)
    assert res.policy == name
    assert 0 < res.cached_tokens <= res.prompt_tokens


def test_program_locality_raises_the_hit_rate_on_bfcl():
    env = hexagent_gym.make(cluster="hetero-1", trace="bfcl_v3", num_workflows=30, seed=0,
                            load=1.5).unwrapped

    def hit_rate(policy):
        res = run_policy(env.factory.simulator(env.episode_seed_for(0)), policy)
        return res.cached_tokens / res.prompt_tokens

    least_loaded = hit_rate(Atlas(locality=False))
    assert hit_rate(Atlas()) > least_loaded + 0.2
    assert hit_rate(SGLangRouter()) > least_loaded + 0.2
