"""hexagent-search: k = 1 is HexAgent, its candidates are HexAgent's preference order, the
implementable fork knows only the arrived workflows and predicted lengths, and the oracle
rollout search never ends worse than HexAgent on its own objective (the rollout-improvement
property of a deterministic simulator)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hexagent_gym.agents.hexagent import HexAgentPolicy
from hexagent_gym.agents.search import HexAgentSearch, HexAgentSearchOracle, HexAgentSearchRevealed
from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.planning.entities import CallState
from hexagent_gym.policy import make_policy, policy_names, run_policy
from hexagent_gym.sim.events import Phase
from hexagent_gym.sim.fork import cut_arrivals, fork, known_only, pending_decision, revealed_only

SMALL = dict(cluster="tiny-2p2d", trace="mixed", num_workflows=14, load=1.0,
             max_calls_per_decision=8)


def simulator(seed: int = 3, **overrides):
    return EpisodeFactory(EpisodeConfig(**(SMALL | overrides), seed=seed)).simulator()


def placements(sim) -> list:
    return [(c.prefill_inst, c.decode_inst, c.prefill_start, c.finish_t)
            for w in sim.workflows for c in w.calls]


def test_registered_with_every_variant():
    names = {"hexagent-search", "hexagent-search-oracle", "hexagent-search-revealed"}
    assert names <= set(policy_names())
    assert make_policy("hexagent-search-oracle").oracle
    assert not make_policy("hexagent-search").oracle
    revealed = make_policy("hexagent-search-revealed")
    assert not revealed.oracle and revealed.knowledge == "revealed"
    assert make_policy("hexagent-search").knowledge == "template"
    with pytest.raises(ValueError, match="knowledge must be one of template, revealed"):
        HexAgentSearch(knowledge="future")


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


def _run_to_end(sim) -> None:
    dp = pending_decision(sim)
    policy = HexAgentPolicy()
    policy.reset(sim)
    while dp is not None:
        while not dp.done:
            dp.pick(*policy.pick(dp))
        dp = sim.run_until_decision()


def test_revealed_only_fork_ends_each_workflow_with_its_revealed_calls():
    # at this fork (found by scanning), four workflows are open with hidden calls, four reveals
    # are on the clock (tools running) and one workflow has no revealed call left open
    sim = simulator(trace="mixed", num_workflows=20, length_predictor="lognormal")
    dp = sim.run_until_decision()
    for _ in range(25):
        while not dp.done:
            dp.pick(*HexAgentPolicy().pick(dp))
        dp = sim.run_until_decision()
    before = placements(sim)
    assert sum(e[1] == Phase.REVEAL for e in sim.events.heap) == 4
    (copy,) = fork(sim)
    revealed_only(copy)
    assert len(copy.finished) == len(sim.finished) + 1  # the one with nothing open: at once
    assert placements(sim) == before  # the original is untouched
    assert not any(e[1] in (Phase.ARRIVAL, Phase.REVEAL) for e in copy.events.heap)
    arrived = len(sim.workflows)
    hidden = {(w.uid, i) for w in sim.workflows if w.finish_t < 0
              for i, c in enumerate(w.calls) if c.state == CallState.HIDDEN}
    assert hidden and len(copy.workload.workflows) == arrived
    # the predicted lengths of known_only apply too
    pairs = zip(sim.workflows, copy.workflows, strict=True)
    assert any(c.l_out != c_copy.l_out for w, w_copy in pairs
               for c, c_copy in zip(w.calls, w_copy.calls, strict=True))
    _run_to_end(copy)
    assert copy.done and len(copy.finished) == arrived
    for w in copy.workflows:
        for i, c in enumerate(w.calls):
            if (w.uid, i) in hidden:
                assert c.state == CallState.HIDDEN and c.finish_t < 0  # never revealed
            else:
                assert c.state == CallState.DONE
        # a workflow ends when its last revealed call does
        assert w.finish_t == max(c.finish_t for c in w.calls)
    # the original, continued, still reveals and runs those calls
    _run_to_end(sim)
    assert all(c.state == CallState.DONE for w in sim.workflows for c in w.calls)


def test_revealed_search_k1_is_hexagent_and_it_changes_picks_with_k4():
    a, b = simulator(trace="bfcl_v3"), simulator(trace="bfcl_v3")
    ra = run_policy(a, HexAgentPolicy())
    rb = run_policy(b, HexAgentSearchRevealed(k=1))
    assert ra.ratios.tolist() == rb.ratios.tolist() and placements(a) == placements(b)
    search = HexAgentSearchRevealed(k=4)
    run_policy(simulator(trace="bfcl_v3"), search)
    assert search.rollouts > 0 and search.changed > 0
    assert len(search.deviations) == search.changed


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


def test_the_search_leaves_picks_to_hexagent_above_the_backlog_bound(monkeypatch):
    """No rollout runs while more arrived workflows than ``max_backlog`` are unfinished; a
    bound the episode never reaches changes nothing."""
    busy = dict(trace="bfcl_v3", num_workflows=20, load=3.0)
    search = HexAgentSearch(k=3, max_backlog=4)
    score = HexAgentSearch._score
    backlogs = []

    def scored(self, cand):
        backlogs.append(len(self._sim.workflows) - len(self._sim.finished))
        return score(self, cand)

    monkeypatch.setattr(HexAgentSearch, "_score", scored)
    run_policy(simulator(**busy), search)
    assert backlogs and max(backlogs) <= 4 and search.over_backlog > 0
    unbounded, far = HexAgentSearch(k=3, max_backlog=None), HexAgentSearch(k=3, max_backlog=20)
    a, b = simulator(**busy), simulator(**busy)
    run_policy(a, unbounded)
    run_policy(b, far)  # 20 workflows: never over 20
    assert placements(a) == placements(b) and far.over_backlog == 0
    assert unbounded.rollouts == far.rollouts > search.rollouts


def _busy_until_five_arrived():
    sim = simulator(trace="bfcl_v3", num_workflows=20, load=3.0)
    dp = sim.run_until_decision()
    while len(sim.workflows) < 5:
        while not dp.done:
            dp.pick(*HexAgentPolicy().pick(dp))
        dp = sim.run_until_decision()
    return sim


def test_cut_arrivals_keeps_the_first_workflows_and_nothing_after():
    sim = _busy_until_five_arrived()
    arrived = len(sim.workflows)
    with pytest.raises(ValueError, match=f"{arrived} have arrived"):
        cut_arrivals(sim, arrived - 1)
    (whole,) = fork(sim)
    cut_arrivals(whole, 20)  # the whole workload: nothing changes
    (cut,) = fork(sim)
    cut_arrivals(cut, arrived + 3)
    ref = _busy_until_five_arrived()
    _run_to_end(ref)
    for copy in (whole, cut):
        _run_to_end(copy)
        assert copy.done
    assert placements(whole) == placements(ref)
    assert len(cut.workflows) == len(cut.finished) == arrived + 3
    assert [w.arrival for w in cut.workflows] == [w.arrival for w in ref.workflows[:arrived + 3]]
    assert len(sim.workflows) == arrived


def test_oracle_rollouts_see_at_most_max_backlog_future_arrivals(monkeypatch):
    import hexagent_gym.agents.search as search_module

    seen = []  # (arrived at the fork, workflows in the rollout's workload)
    finished = search_module._Finished

    def spy(sim, scored):
        seen.append((scored, len(sim.workload.workflows)))
        return finished(sim, scored)

    monkeypatch.setattr(search_module, "_Finished", spy)
    run_policy(simulator(trace="bfcl_v3", num_workflows=20, load=3.0),
               HexAgentSearchOracle(k=2, max_backlog=3))
    assert seen and all(total <= arrived + 3 for arrived, total in seen)
    assert any(total < 20 for _, total in seen)  # the window binds somewhere
    seen.clear()
    run_policy(simulator(trace="bfcl_v3", num_workflows=20, load=3.0),
               HexAgentSearchOracle(k=2, max_backlog=None))
    assert seen and all(total == 20 for _, total in seen)  # no bound: the whole true future


@pytest.mark.parametrize("config", ["configs/experiments/headroom.yaml",
                                    "configs/experiments/search_knowledge.yaml",
                                    "configs/experiments/teacher_heldout.yaml",
                                    "configs/mixtures/bfcl-mix.yaml"])
def test_the_default_backlog_bound_never_binds_where_the_search_is_reported(config):
    # docs/learned.md's search figures come from these episodes: a backlog of at most their
    # length can never exceed the default bound, and the oracle's window of arrived + bound
    # workflows always holds the whole episode, so the bound leaves those figures as they are
    import yaml

    from hexagent_gym.agents.search import MAX_BACKLOG

    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / config).read_text())
    assert (doc.get("episode") or doc)["num_workflows"] <= MAX_BACKLOG


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        HexAgentSearch(k=0)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="max_backlog must be an integer >= 1 or None"):
            HexAgentSearch(max_backlog=bad)
    with pytest.raises(ValueError, match="horizon must be one of arrived, episode"):
        HexAgentSearch(horizon="forever")
    with pytest.raises(ValueError, match="needs oracle=True"):
        HexAgentSearch(horizon="episode")
    assert np.isfinite(run_policy(simulator(trace="bfcl_v3", num_workflows=4),
                                  HexAgentSearch(k=2)).req99)
