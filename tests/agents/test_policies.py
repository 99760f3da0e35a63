"""Hand-checked orders and placements of every built-in policy, and the registry."""

from __future__ import annotations

import numpy as np
import pytest

from hexagent_gym.agents.baselines import (
    Atlas,
    CallFCFS,
    LeastLaxityFirst,
    RandomPolicy,
    WorkflowFCFS,
)
from hexagent_gym.agents.hexagent import HexAgentPolicy
from hexagent_gym.planning.decisions import Stage
from hexagent_gym.policy import make_policy, policy_names, register_policy, run_policy
from hexagent_gym.sim.simulator import Simulator
from hexagent_gym.workload.arrivals import EpisodeWorkload
from hexagent_gym.workload.workload import make_workflow
from tests.toy import ToyLatency, toy_cluster

SLOW = ToyLatency(a=0.0, b=3e-4, c=0.04, e=1e-3, f=1e-6)
FAST = ToyLatency(a=0.0, b=1e-4, c=0.01, e=1e-3, f=1e-6)


def two_call_decision(arrivals=(0.0, 0.0), l_in=(1000, 1000)):
    """Two one-call workflows arriving together on (slow, fast) x (slow, fast)."""
    wfs = [make_workflow([(l_in[i], 50, 0.0, [])], f"w{i}") for i in range(2)]
    sim = Simulator(toy_cluster(prefill=(SLOW, FAST), decode=(SLOW, FAST)),
                    EpisodeWorkload(tuple(wfs), np.zeros(2), np.arange(2)))
    dp = sim.run_until_decision()
    for wf, a in zip(sim.workflows, arrivals, strict=True):
        wf.arrival = a  # pretend the workflow arrived earlier (elapsed time raises its risk)
    return sim, dp


def test_registry_resolves_names_case_insensitively_and_rejects_unknown_ones():
    assert set(policy_names()) >= {"hexagent", "fcfs", "wf-fcfs", "llf", "atlas", "random"}
    assert isinstance(make_policy("HexAgent"), HexAgentPolicy)
    assert isinstance(make_policy("wf-fcfs"), WorkflowFCFS)
    with pytest.raises(ValueError, match="unknown policy 'hexagnt'; known: atlas, .*Did you "
                       "mean: `hexagent`"):
        make_policy("hexagnt")
    with pytest.raises(ValueError, match="already registered"):
        register_policy("fcfs", CallFCFS)


def test_hexagent_puts_the_at_risk_call_on_the_fast_pair():
    sim, dp = two_call_decision(arrivals=(0.0, -5.0))  # workflow 1 has waited 5 s
    pol = HexAgentPolicy()
    slot, p, d = pol.pick(dp)
    assert (slot, p, d) == (1, 1, 1)  # riskiest first, on the fast prefill and fast decode
    dp.pick(slot, p, d)
    slot, p, d = pol.pick(dp)
    # the fast prefill is busy for 0.1 s, yet queueing there (prefill done at 0.2 s) still
    # beats the idle slow instance (0.3 s)
    assert slot == 0 and p == 1


def test_hexagent_risk_ranks_by_elapsed_over_horizon():
    from hexagent_gym.agents.hexagent import projected_risk

    _, dp = two_call_decision(arrivals=(-2.0, 0.0))
    risk = projected_risk(dp)
    h = [c.workflow.h_est for c in dp.calls]
    best = dp.delta.reshape(2, -1).min(axis=1)
    assert risk[0] == pytest.approx((2.0 + best[0]) / h[0])
    assert risk[1] == pytest.approx(best[1] / h[1])
    assert risk[0] > risk[1]


@pytest.mark.parametrize("cluster,trace,load", [("hetero-1-x4", "bfcl_v3", 1.2),
                                                ("hetero-1", "mixed", 3.0)])
def test_hexagent_scalar_ranking_equals_numpy_argmax_at_every_pick(cluster, trace, load):
    """HexAgent ranks short windows in scalar Python: the slot must be numpy's
    ``argmax(projected_risk(dp))`` at every multi-call pick of whole episodes."""
    from hexagent_gym.agents.hexagent import projected_risk
    from hexagent_gym.episode import EpisodeConfig, EpisodeFactory

    sim = EpisodeFactory(EpisodeConfig(cluster=cluster, trace=trace, num_workflows=120,
                                       load=load, seed=4)).simulator()
    pol = HexAgentPolicy()
    pol.reset(sim)
    compared = 0
    dp = sim.run_until_decision()
    while dp is not None:
        while not dp.done:
            if dp.num_remaining > 1 and len(dp.calls) <= pol.one_pass_threshold:
                assert pol._riskiest(dp) == int(np.argmax(projected_risk(dp)))
                compared += 1
            dp.pick(*pol.pick(dp))
        dp = sim.run_until_decision()
    assert compared > 30


def test_hexagent_scalar_ranking_follows_numpy_on_ties_and_nan():
    from hexagent_gym.agents.hexagent import projected_risk

    _, dp = two_call_decision()  # two identical calls: equal risks, the first slot wins
    pol = HexAgentPolicy()
    assert pol._riskiest(dp) == 0
    for c in dp.calls:
        c.workflow.h_est = 0.0  # zero horizons: risk inf (or NaN) like numpy's division
    pol._inputs_of = None
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = int(np.argmax(projected_risk(dp)))
    dp._batch = None
    with np.errstate(divide="ignore", invalid="ignore"):
        assert pol._riskiest(dp) == expected


def test_hexagent_one_pass_orders_once_and_places_under_updated_state():
    _, dp = two_call_decision(arrivals=(0.0, -5.0))
    pol = HexAgentPolicy(one_pass_threshold=1)
    first = pol.pick(dp)
    dp.pick(*first)
    second = pol.pick(dp)
    assert first[0] == 1 and second[0] == 0


def test_workflow_fcfs_keeps_workflow_order_and_fcfs_keeps_reveal_order():
    _, dp = two_call_decision(arrivals=(0.0, -1.0))
    assert WorkflowFCFS().pick(dp)[0] == 1  # the earlier workflow first
    assert CallFCFS().pick(dp)[0] == 0  # the earlier-revealed call first


def test_least_loaded_placement_ignores_speed_and_rotates_on_ties():
    _, dp = two_call_decision()
    pol = CallFCFS()
    a = pol.pick(dp)
    dp.pick(*a)
    b = pol.pick(dp)
    assert a == (0, 0, 0)  # an idle cluster: the first instance, although it is the slow one
    assert b == (1, 1, 1)  # instance 0 now holds work: the other one


def test_llf_orders_by_laxity():
    _, dp = two_call_decision()
    w0, w1 = (c.workflow for c in dp.calls)
    w0.h_est, w1.h_est = 10.0, 1.0  # workflow 1 has the tighter deadline
    pol = LeastLaxityFirst(alpha_ref=2.0)
    lax = [pol.order_key(dp, i)[0] for i in range(2)]
    est = [c.est_duration for c in dp.calls]
    assert lax == pytest.approx([2.0 * 10.0 - est[0], 2.0 * 1.0 - est[1]])
    assert pol.pick(dp)[0] == 1


def test_atlas_levels_and_anti_starvation():
    pol = Atlas(thresholds=(1.0, 4.0), beta=3.0)
    assert pol.level(0.5, 0.0) == 0
    assert pol.level(2.0, 0.0) == 1
    assert pol.level(10.0, 0.0) == 2
    assert pol.level(10.0, 29.0) == 2
    assert pol.level(10.0, 30.0) == 0  # waited beta x service: promoted to the top queue
    _, dp = two_call_decision()
    w0, w1 = (c.workflow for c in dp.calls)
    w0.service = 2.0  # workflow 0 already got service: workflow 1 goes first
    assert pol.pick(dp)[0] == 1
    with pytest.raises(ValueError, match="increasing"):
        Atlas(thresholds=(4.0, 1.0))


def test_random_policy_is_valid_and_reproducible():
    def run(seed):
        sim, dp = two_call_decision()
        pol = RandomPolicy(seed=seed)
        pol.reset(sim)
        picks = []
        while not dp.done:
            pick = pol.pick(dp)
            dp.pick(*pick)  # raises if invalid
            picks.append(pick)
        return picks

    assert run(3) == run(3)


@pytest.mark.parametrize("name", ["hexagent", "fcfs", "wf-fcfs", "llf", "atlas", "random",
                                  "fallback"])
def test_every_policy_completes_a_small_episode(name):
    wfs = [make_workflow([(300 + 50 * i, 20, 0.0, []), (200, 10, 0.1, [0]),
                          (150, 5, 0.0, [0]), (100, 5, 0.0, [1, 2])], f"w{i}") for i in range(8)]
    sim = Simulator(toy_cluster(prefill=(SLOW, FAST), decode=(SLOW, FAST)),
                    EpisodeWorkload(tuple(wfs), np.linspace(0, 0.3, 8), np.arange(8)))
    res = run_policy(sim, make_policy(name))
    assert res.num_workflows == 8 and res.num_calls == 32
    assert np.all(res.ratios > 0.99)  # nothing beats the standalone horizon by much
    assert res.policy == name


def test_hexagent_lb_orders_like_hexagent_and_places_like_the_baselines():
    from hexagent_gym.agents.ablation import HexAgentLoadBalanced
    from hexagent_gym.agents.base import LeastLoadedPlacement
    from hexagent_gym.agents.hexagent import HexAgentPolicy
    from hexagent_gym.episode import EpisodeConfig, EpisodeFactory

    factory = EpisodeFactory(EpisodeConfig(cluster="hetero-1", trace="bfcl_v3",
                                           num_workflows=30, load=None, arrival_rate=40.0))
    sim = factory.simulator(seed=1)
    mixed, order, place = HexAgentLoadBalanced(), HexAgentPolicy(), LeastLoadedPlacement()
    for pol in (mixed, order):
        pol.reset(sim)
    place.reset()
    checked = 0
    dp = sim.run_until_decision()
    while dp is not None:
        while not dp.done:
            slot, p, d = mixed.pick(dp)
            assert slot == order.pick(dp)[0]  # the same call as HexAgent would pick
            assert (p, d) == place(dp, slot)  # at the load-balanced pair
            dp.pick(slot, p, d)
            checked += 1
        dp = sim.run_until_decision()
    assert checked >= 2 * sim.result().num_calls  # every call at both stages (re-plans too)


def test_a_call_moves_at_most_once():
    # little KV, twin instances, log-normal predictions: projected room on another instance is
    # often gone when the KV lands there. Before moves were limited HexAgent bounced these 24
    # calls between instances tens of thousands of times.
    lm = ToyLatency()
    cluster = toy_cluster(prefill=(lm, lm, lm), decode=(lm, lm, lm), capacity=4000)
    rng = np.random.default_rng(7)
    wfs = tuple(make_workflow([(int(rng.integers(300, 900)), int(rng.integers(100, 600)), 0.0,
                                []) for _ in range(3)], f"w{i}") for i in range(8))
    sim = Simulator(cluster, EpisodeWorkload(wfs, np.arange(8) * 0.03, np.arange(8)),
                    length_predictor="lognormal", rng=rng)
    seen_locked = []

    def pick(dp):
        if dp.stage == Stage.DECODE:
            seen_locked.extend(bool(dp.batch.locked[i]) for i, c in enumerate(dp.calls)
                               if c.moved)
        return HexAgentPolicy().pick(dp)

    res = sim.run(pick)
    moved = [c for w in sim.workflows for c in w.calls if c.moved]
    assert 0 < res.decode_moves == len(moved) <= 24
    assert seen_locked and all(seen_locked)  # a moved call waits locked to its new instance


def _picks_of(sim, run) -> list:
    """Every pick of ``sim``'s episode as (call uid, p, d, Δ), in order, after ``run(sim)``."""
    plans = []
    close = sim._close_decision

    def record(dp):
        plans.extend((c.uid, p, d, delta) for c, p, d, delta in dp.plan)
        close(dp)

    sim._close_decision = record
    result = run(sim)
    return plans, result.ratios.tolist()


@pytest.mark.parametrize("name", ["hexagent", "hexagent-lb"])
def test_decide_makes_exactly_the_picks_that_pick_makes(name):
    """run_policy lets HexAgent answer a decision in one call (pick, then ``dp.follow_plan``);
    the episode is the one ``pick`` makes alone, pick for pick (Δ included). A subclass with
    its own placement (hexagent-lb) leaves the plan at once: its ``decide`` picks nothing."""
    from hexagent_gym.episode import EpisodeConfig, EpisodeFactory

    factory = EpisodeFactory(EpisodeConfig(cluster="hetero-1-x4", trace="bfcl_v3",
                                           num_workflows=200, load=1.2, seed=3))
    policy = make_policy(name)
    batched = _picks_of(factory.simulator(), lambda sim: run_policy(sim, policy))
    sim = factory.simulator()
    policy.reset(sim)
    one_by_one = _picks_of(sim, lambda s: s.run(policy.pick))  # no decide: pick by pick
    assert batched == one_by_one
    sim = factory.simulator()
    policy.reset(sim)
    made = []  # (calls, picks made by decide) per decision

    def deciding(dp):
        policy.decide(dp)
        made.append((len(dp.calls), len(dp.plan)))

    sim.run(policy.pick, decide=deciding)
    if name == "hexagent":  # many multi-call decisions answered whole in one call
        assert sum(n > 1 and m == n for n, m in made) > 50
    else:
        assert all(m == 0 for _, m in made) and sum(n > 1 for n, _ in made) > 5


def _state_lists(dp) -> tuple:
    st = dp.state
    return (st.free_l, st.pf_tokens_l, st.dec_tokens_l, st.dec_count_l, st.dec_ctx_l,
            st._pick_log, st.kernel_limits(), st.decode_scan())


def test_follow_plan_makes_the_plans_rest_and_nothing_after_a_pick_off_it():
    """follow_plan leaves the decision and Ŝ exactly as picking the plan's rest one by one
    does; with no plan, or after a pick off it, it picks nothing."""
    from hexagent_gym.episode import EpisodeConfig, EpisodeFactory

    factory = EpisodeFactory(EpisodeConfig(cluster="hetero-1-x4", trace="bfcl_v3",
                                           num_workflows=200, load=1.2, seed=3))
    hexagent = make_policy("hexagent")

    def decision(sim, at_least):
        dp = sim.run_until_decision()
        while not (dp.stage == Stage.PREFILL and len(dp.calls) >= at_least):
            while not dp.done:
                dp.pick(*hexagent.pick(dp))
            dp = sim.run_until_decision()
        return dp

    hexagent.reset(sim := factory.simulator())
    dp = decision(sim, 4)
    assert dp.follow_plan() == 0  # no plan computed yet
    plan = dp.risk_plan()
    assert len(plan) == len(dp.calls) >= 4
    dp.pick(*plan[0][:3])
    assert dp.follow_plan() == len(plan) - 1 and dp.done
    assert [(dp.calls.index(c), p, d, delta) for c, p, d, delta in dp.plan] == plan
    assert dp.follow_plan() == 0
    hexagent.reset(twin := factory.simulator())  # the same decision, picked one by one
    one = decision(twin, 4)
    assert one.risk_plan() == plan
    for slot, p, d, _ in plan:
        one.pick(slot, p, d)
    assert [(c.uid, p, d, x) for c, p, d, x in one.plan] == [
        (c.uid, p, d, x) for c, p, d, x in dp.plan]
    assert _state_lists(one) == _state_lists(dp)
    dp = decision(sim, 3)
    plan = dp.risk_plan()
    other = next(i for i in range(len(dp.calls)) if i != plan[0][0])
    dp.pick(other, *dp.best_pair(other)[:2])  # off the plan: its rest is stale
    assert dp.follow_plan() == 0 and dp.num_remaining == len(dp.calls) - 1


def test_decide_where_the_plan_stops_early_leaves_the_rest_to_pick():
    """Where a decode limit binds, the compiled plan stops short; decide makes its picks and
    the simulator asks pick for the rest: the episode is still pick's, pick for pick."""
    from tests.toy import tight_memory_simulator

    policy = make_policy("hexagent")
    batched = _picks_of(tight_memory_simulator(), lambda sim: run_policy(sim, policy))
    sim = tight_memory_simulator()
    policy.reset(sim)
    assert batched == _picks_of(sim, lambda s: s.run(policy.pick))
    sim = tight_memory_simulator()
    policy.reset(sim)
    made = []

    def deciding(dp):
        policy.decide(dp)
        made.append((len(dp.calls), len(dp.plan)))

    sim.run(policy.pick, decide=deciding)
    assert any(1 < m < n for n, m in made)  # a partial plan, finished by pick


@pytest.mark.parametrize("name", policy_names())
def test_a_policy_lets_the_collector_pause_only_if_it_leaves_no_cycles_mid_episode(name,
                                                                                  monkeypatch):
    """run_policy pauses the garbage collector for the episode unless the policy says
    ``pause_gc = False``: collections between decisions find nothing to free for every policy
    that lets it pause (horizons filled first: their standalone runs happen once per trace),
    and plenty for those that do not (the search policies drop forks of the simulator)."""
    import gc

    from hexagent_gym.episode import EpisodeConfig, EpisodeFactory

    factory = EpisodeFactory(EpisodeConfig(cluster="hetero-1", trace="mixed", num_workflows=12,
                                           load=1.0, seed=0))
    factory.fill_horizons()
    policy = make_policy(name)
    sim = factory.simulator()
    policy.reset(sim)
    found = []
    advance = type(sim).run_until_decision

    def collecting(self):  # every 8th decision of the episode (not of a search's forks)
        if self is sim and len(sim.invocation_seconds) % 8 == 0:
            found.append(gc.collect(1))  # the young generations: where a decision's cycles are
        return advance(self)

    monkeypatch.setattr(type(sim), "run_until_decision", collecting)
    gc.collect()
    sim.run(policy.pick, decide=getattr(policy, "decide", None), pause_gc=False)
    assert len(found) > 20
    if getattr(policy, "pause_gc", True):
        assert sum(found) == 0
    else:
        assert sum(found) > 1000


@pytest.mark.parametrize("name", policy_names())
def test_a_closed_episode_leaves_the_collector_nothing_for_every_policy(name):
    """run_policy(close=True) frees the whole episode by reference counting for every policy
    that lets the collector pause (the search policies' dropped forks are theirs to collect):
    no policy state forms a cycle with the episode's objects."""
    import gc

    from hexagent_gym.episode import EpisodeConfig, EpisodeFactory

    factory = EpisodeFactory(EpisodeConfig(cluster="hetero-1", trace="mixed", num_workflows=12,
                                           load=1.0, seed=0))
    factory.fill_horizons()
    policy = make_policy(name)
    gc.collect()
    gc.disable()
    try:
        result = run_policy(factory.simulator(), policy, close=True)
        found = gc.collect()
    finally:
        gc.enable()
    assert result.num_calls > 50
    if getattr(policy, "pause_gc", True):
        assert found == 0
