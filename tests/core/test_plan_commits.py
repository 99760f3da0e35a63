"""Committing a followed plan in one loop, and the per-call constants the projections keep.

``PlanState.commit_prefill_picks`` must leave Ŝ exactly as :meth:`PlanState.commit` of each pick
in turn (``DecisionPoint.follow_plan`` relies on it); the call's ``ctx_share`` slot and its kept
``dec_weight``, ``own_ctx`` and ``kv_demand`` must equal what their formulas give, sample groups
included.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.planning.cluster_tables import ClusterTables, mean_own_context
from hexagent_gym.planning.decisions import Stage
from hexagent_gym.planning.plan_state import PlanState
from hexagent_gym.policy import make_policy
from tests.toy import ToyLatency, tight_memory_simulator, toy_cluster


def _lists(state) -> tuple:
    return (state.free_l, state.pf_tokens_l, state.dec_tokens_l, state.dec_count_l,
            state.dec_ctx_l, state._pick_log, state._limits, state._scan)


def _prefill_decisions(sim, policy, at_least=2):
    """The open prefill decisions of an episode with ``at_least`` calls (before their picks);
    every decision is then answered by ``policy``."""
    dp = sim.run_until_decision()
    while dp is not None:
        if dp.stage == Stage.PREFILL and len(dp.calls) >= at_least:
            yield dp
        while not dp.done:
            dp.pick(*policy.pick(dp))
        dp = sim.run_until_decision()


def _one_by_one(state, picks, cache_aware):
    for call, p, d, delta in picks:
        state.commit(call, p, d, delta, True, (call.pf_est if cache_aware else call.pf_cold)[p])


@pytest.mark.parametrize("prepared", ["nothing", "limits and scan", "numpy twins",
                                      "step times", "release lists"])
@pytest.mark.parametrize("make_sim", ["hetero-1-x4", "tight memory"])
def test_batched_commits_equal_commits_one_by_one(prepared, make_sim):
    """Bit for bit the same lists, pick log, limits, scan (and numpy twins, step-time cache and
    release lists where they were built) as commit() pick after pick, whatever Ŝ had built."""
    if make_sim == "tight memory":
        sim = tight_memory_simulator()
    else:
        sim = EpisodeFactory(EpisodeConfig(cluster=make_sim, trace="bfcl_v3", num_workflows=120,
                                           load=1.2, seed=5)).simulator()
    hexagent = make_policy("hexagent")
    hexagent.reset(sim)
    checked = 0
    for dp in _prefill_decisions(sim, hexagent):
        # the decision's best pairs, each taken under the Ŝ of the picks before it
        base = dp.state.copy()
        picks, probe = [], base.copy()
        for call in dp.calls:
            p, d, delta = probe.earliest_pair(call)
            probe.commit(call, p, d, delta, True)
            picks.append((call, p, d, delta))
        a, b = base.copy(), base.copy()
        for state in (a, b):
            if prepared == "limits and scan":
                state.limits(), state.decode_scan()
            elif prepared == "numpy twins":
                state.free, state.dec_tokens, state.dec_count  # noqa: B018 (builds the twins)
            elif prepared == "step times":
                state._tau  # noqa: B018
            elif prepared == "release lists":
                state._release_list(picks[0][2])
        a.commit_prefill_picks(picks)
        _one_by_one(b, picks, True)
        assert _lists(a) == _lists(b)
        assert {k: v.tolist() for k, v in a._arrays.items()} == {
            k: v.tolist() for k, v in b._arrays.items()}
        for name, values in (("free", a.free_l), ("dec_tokens", a.dec_tokens_l),
                             ("dec_count", a.dec_count_l)):
            if name in a._arrays:
                assert a._arrays[name].tolist() == values
        assert (a._tau_cache is None) == (b._tau_cache is None)
        if a._tau_cache is not None:
            assert [x.tolist() for x in a._tau_cache] == [x.tolist() for x in b._tau_cache]
        assert a._releases == b._releases
        cold_a, cold_b = base.copy(), base.copy()  # a cache-oblivious planner's seconds
        cold_a.commit_prefill_picks(picks, cache_aware=False)
        _one_by_one(cold_b, picks, False)
        assert _lists(cold_a) == _lists(cold_b)
        checked += 1
        if checked == 12:
            break
    assert checked >= 3


def test_batched_commits_move_the_scan_limits_and_log_by_hand():
    """Two toy decode instances (capacity 1,000 tokens, batches of 2), one call on d=0: a pick
    onto idle d=1 drops the kept scan; the kept limits shrink to the slack left and note the
    batch a second pick on d=0 fills; the log holds (d, now + Δ, KV)."""
    lm = ToyLatency()
    tables = ClusterTables(toy_cluster(prefill=(lm, lm), decode=(lm, lm), capacity=1000,
                                       max_batch=2))
    state = PlanState(tables, 10.0, [10.0, 12.0], [400.0, 0.0], [1, 0], [300.0, 0.0], [], set(),
                      [0.0, 50.0])
    assert state.limits() == (600.0, False) and state.decode_scan() == [0, 1]

    def call(l_in, pf):
        return SimpleNamespace(l_in=l_in, kv_pred=l_in + 100, ctx_share=l_in + 50.0,
                               pf_est=pf, pf_cold=[9.0, 9.0])

    a, b = call(200, [0.5, 0.25]), call(100, [0.75, 0.125])
    state.commit_prefill_picks([(a, 1, 1, 2.0), (b, 0, 0, 3.0)])
    assert state._scan is None  # d=1 was idle: the scan changed
    assert state.free_l == [10.75, 12.25] and state.pf_tokens_l == [100.0, 250.0]
    assert state.dec_tokens_l == [600.0, 300.0] and state.dec_count_l == [2, 1]
    assert state.dec_ctx_l == [450.0, 250.0]
    assert state._limits == (400.0, True)  # d=0: 1,000 − 600 left, its batch of 2 full
    assert state._limits == state._decode_limits()
    assert state._pick_log == [(1, 12.0, 300.0), (0, 13.0, 200.0)]
    cold = PlanState(tables, 10.0, [10.0, 12.0], [400.0, 0.0], [1, 0], [300.0, 0.0], [], set())
    cold.commit_prefill_picks([(a, 1, 1, 2.0)], cache_aware=False)
    assert cold.free_l == [10.0, 21.0]


def test_ctx_share_and_kept_constants_follow_their_formulas():
    """Every call's ctx_share is L_in + L̂_out/2 (a group leader's with the group's longest
    prediction) and the constants the projections keep on it are those they would compute."""
    factory = EpisodeFactory(EpisodeConfig(cluster="hetero-1", trace="lats", num_workflows=30,
                                           load=1.0, seed=1, estimation_error=0.2))
    sim = factory.simulator()
    policy = make_policy("hexagent")
    policy.reset(sim)
    sim.run(policy.pick)
    calls = [c for w in sim.workflows for c in w.calls]
    assert any(c.width > 1 for c in calls)  # LATS forms sample groups
    kept = 0
    for c in calls:
        assert c.ctx_share == c.l_in + 0.5 * c.l_out_pred
        if c.dec_weight is not None:
            l_out = float(c.l_out_pred)
            assert (c.dec_weight, c.own_ctx, c.kv_demand) == (
                l_out * c.dec_err, mean_own_context(c.l_in, l_out), float(c.kv_pred))
            kept += 1
    assert kept > 500  # riders are planned through their leaders: many keep none
