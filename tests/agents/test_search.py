"""hexagent-search: k = 1 is HexAgent, its candidates are HexAgent's preference order, the
implementable fork knows only the arrived workflows and predicted lengths, and the oracle
rollout search never ends worse than HexAgent on its own objective (the rollout-improvement
property of a deterministic simulator)."""

from __future__ import annotations

import numpy as np
import pytest

from agents.hexagent import HexAgentPolicy
from agents.search import HexAgentSearch, HexAgentSearchOracle
from hexagent_gym.entities import CallState
from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.events import Phase
from hexagent_gym.fork import fork, known_only, pending_decision
from hexagent_gym.policy import make_policy, policy_names, run_policy

SMALL = dict(cluster="tiny-2p2d", trace="mixed", num_workflows=14, load=1.0,
             max_calls_per_decision=8)


def simulator(seed: int = 3, **overrides):
    return EpisodeFactory(EpisodeConfig(**(SMALL | overrides), seed=seed)).simulator()


def placements(sim) -> list:
    return [(c.prefill_inst, c.decode_inst, c.prefill_start, c.finish_t)
            for w in sim.workflows for c in w.calls]


def test_registered_with_both_variants():
    assert {"hexagent-search", "hexagent-search-oracle"} <= set(policy_names())
    assert make_policy("hexagent-search-oracle").oracle
    assert not make_policy("hexagent-search").oracle


def test_k1_is_hexagent_exactly():
    a, b = simulator(), simulator()
    ra = run_policy(a, HexAgentPolicy())
    rb = run_policy(b, HexAgentSearch(k=1))
    assert ra.ratios.tolist() == rb.ratios.tolist() and placements(a) == placements(b)


def test_candidates_start_with_hexagents_pick_and_are_distinct_and_valid():
    sim = simulator(trace="lats")
    search = HexAgentSearch(k=5)
    search.reset(sim)
    dp = sim.run_until_decision()
    seen_multi = 0
    for _ in range(60):
        if dp is None:
            break
        while not dp.done:
            own = HexAgentPolicy().pick(dp)
            cands = search.candidates(dp, own)
            assert cands[0] == own and len(set(cands)) == len(cands) <= 5
            for slot, p, d in cands:
                assert not dp.picked[slot] and dp.feasible(slot)[p, d]
            seen_multi += len(cands) > 1
            dp.pick(*own)
        dp = sim.run_until_decision()
    assert seen_multi > 5


def test_known_only_fork_drops_future_arrivals_and_uses_predicted_lengths():
    sim = simulator(num_workflows=30, length_predictor="lognormal")
    dp = sim.run_until_decision()
    for _ in range(6):
        while not dp.done:
            dp.pick(*HexAgentPolicy().pick(dp))
        dp = sim.run_until_decision()
    (copy,) = fork(sim)
    known_only(copy)
    arrived = len(sim.workflows)
    assert len(copy.workload.workflows) == arrived < 30
    assert not any(e[1] == Phase.ARRIVAL for e in copy.events.heap)
    changed = 0
    for w_copy, w in zip(copy.workflows, sim.workflows, strict=True):
        for c_copy, c in zip(w_copy.calls, w.calls, strict=True):
            plain = c.width == 1 and c.lead is None and c.generated == 0
            if c.state < CallState.DECODE and plain:
                assert c_copy.l_out == c.l_out_pred
                assert c_copy.kv_true - c_copy.l_out == c.kv_true - c.l_out
                changed += c.l_out != c.l_out_pred
            else:
                assert c_copy.l_out == c.l_out
    assert changed > 0  # the lognormal predictor misses the true lengths
    # the cut fork runs to its (shorter) end
    dp = pending_decision(copy)
    policy = HexAgentPolicy()
    while dp is not None:
        while not dp.done:
            dp.pick(*policy.pick(dp))
        dp = copy.run_until_decision()
    assert len(copy.finished) == arrived and copy.done


def test_oracle_search_is_never_worse_than_hexagent_on_its_objective():
    # each pick's first candidate continues exactly HexAgent's own trajectory, so the chosen
    # continuation can only improve on it (deterministic simulator, exact forks)
    busy = dict(trace="bfcl_v3", num_workflows=20, load=1.5)
    base = run_policy(simulator(**busy), HexAgentPolicy())
    search = HexAgentSearchOracle(k=3, horizon="episode")
    result = run_policy(simulator(**busy), search)
    key = (result.req99, float(result.ratios.mean()))
    assert key <= (base.req99, float(base.ratios.mean()))
    assert search.changed > 0 and search.rollouts > search.changed
    # every change is recorded with a strict improvement of the (Req99, mean ratio) score
    assert len(search.deviations) == search.changed
    for kind, window, d99, dmean in search.deviations:
        assert kind in ("pair", "call") and window >= 1
        assert d99 > 0 or (d99 == 0 and dmean > 0)
        assert kind == "pair" or window >= 2  # another call needs a second call


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        HexAgentSearch(k=0)
    with pytest.raises(ValueError, match="horizon must be one of arrived, episode"):
        HexAgentSearch(horizon="forever")
    with pytest.raises(ValueError, match="needs oracle=True"):
        HexAgentSearch(horizon="episode")
    assert np.isfinite(run_policy(simulator(trace="bfcl_v3", num_workflows=4),
                                  HexAgentSearch(k=2)).req99)
