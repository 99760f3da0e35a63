"""Idle decode twins: scalar placements look at one of them, and decide exactly as before.

``placement.decode_scan`` keeps every decode instance holding a committed call and, of each set
of idle instances of one kind, only the lowest index. The rules that read it (the fallback's
``earliest_pair``, ``best_prefill_pair_one``, ``best_decode_pair_one``) break ties by the lowest
decode index, so the skipped twins (identical floats, higher index) can never win.
"""

from __future__ import annotations

import numpy as np
import pytest

from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.planning.cluster_tables import ClusterTables
from hexagent_gym.planning.decisions import Stage
from hexagent_gym.planning.placement import decode_scan
from hexagent_gym.planning.plan_state import PlanState
from hexagent_gym.policy import make_policy, run_policy
from tests.toy import ToyLatency, toy_cluster


def test_scan_keeps_busy_instances_and_the_first_of_each_idle_kind():
    fast, slow = ToyLatency(), ToyLatency(c=0.04)
    # kinds: 0 1 0 0 2 0 (instance 4 has less memory, instance 1 a slower model)
    cluster = toy_cluster(decode=(fast, slow, fast, fast, fast, fast),
                          capacity=(9000, 9000, 9000, 9000, 5000, 9000))
    tables = ClusterTables(cluster)
    assert tables.dec_kind == [0, 1, 0, 0, 2, 0]
    count = [0, 0, 1, 0, 0, 0]
    tokens = [0.0, 0.0, 700.0, 0.0, 0.0, 0.0]
    ctx = [0.0, 0.0, 500.0, 0.0, 0.0, 0.0]
    # 0 first idle fast; 1 idle slow; 2 busy; 3 twin of 0; 4 other memory; 5 twin of 0
    assert decode_scan(tables, tokens, count, ctx) == [0, 1, 2, 4]
    # an idle instance left with a context residue is no twin of a clean one
    assert decode_scan(tables, tokens, count, [0.0, 0.0, 500.0, 1e-12, 0.0, 0.0]) == [0, 1, 2, 3, 4]
    # committed tokens without a committed call: its limit may bind, so it is looked at
    assert decode_scan(tables, [0.0, 0.0, 700.0, 0.0, 0.0, 40.0], count, ctx) == [0, 1, 2, 4, 5]


def test_network_column_separates_kinds():
    lm = ToyLatency()
    cluster = toy_cluster(prefill=(lm,), decode=(lm, lm, lm))
    cluster.transfer_setup_s[0, 2] = 0.005  # instance 2 sits farther from the prefill pool
    tables = ClusterTables(cluster)
    assert tables.dec_kind == [0, 0, 1]
    assert decode_scan(tables, [0.0] * 3, [0] * 3, [0.0] * 3) == [0, 2]


def test_commit_on_an_idle_twin_refreshes_the_scan():
    lm = ToyLatency()
    tables = ClusterTables(toy_cluster(prefill=(lm,), decode=(lm, lm, lm)))
    state = PlanState(tables, 0.0, [0.0], [0.0] * 3, [0] * 3, [0.0] * 3, [], set())
    assert state.decode_scan() == [0]
    call = type("C", (), {"pf_est": [0.1], "l_in": 100, "kv_pred": 300.0, "ctx_share": 200.0})()
    state.commit(call, 0, 0, 1.0, True)
    assert state.decode_scan() == [0, 1]  # 0 is busy now, 1 the first idle twin
    copy = state.copy()
    copy.commit(call, 0, 1, 1.0, True)
    assert copy.decode_scan() == [0, 1, 2]
    assert state.decode_scan() == [0, 1]  # the copy's commit leaves the original alone


def _decisions(config: EpisodeConfig):
    """Every decision point of an episode, yielded before its picks; then each call is placed
    at its best pair in window order."""
    sim = EpisodeFactory(config).simulator()
    dp = sim.run_until_decision()
    while dp is not None:
        yield dp
        while not dp.done:
            slot = dp.picked.index(False)
            dp.pick(slot, *dp.best_pair(slot)[:2])
        dp = sim.run_until_decision()


def _full_scan(monkeypatch):
    """Make every scalar rule look at all decode instances (the code before the scan)."""
    import hexagent_gym.planning.placement as placement
    monkeypatch.setattr(placement, "decode_scan",
                        lambda tables, tokens, count, ctx: list(range(tables.num_decode)))
    monkeypatch.setattr(PlanState, "decode_scan",
                        lambda self: list(range(self.tables.num_decode)))


def _picks(config: EpisodeConfig, policy: str) -> tuple[list, int]:
    """Every call's placement and times, and the number of decode moves."""
    sim = EpisodeFactory(config).simulator()
    run_policy(sim, make_policy(policy))
    return [(c.prefill_inst, c.decode_inst, c.prefill_start, c.decode_start, c.finish_t)
            for w in sim.workflows for c in w.calls], sim.moves


@pytest.mark.parametrize("policy", ["hexagent", "fallback"])
def test_decisions_equal_the_full_scan_on_a_cluster_with_many_idle_twins(policy, monkeypatch):
    # 32 + 32 instances at a light load: most decode instances sit idle, in 4-member kinds
    config = EpisodeConfig(cluster="hetero-1-x4", trace="bfcl_v3", num_workflows=120, load=0.5,
                           seed=3)
    skipped = max(dp.num_decode - len(dp.state.decode_scan()) for dp in _decisions(config))
    assert skipped >= 16  # the scan really skips twins in this episode
    fast = _picks(config, policy)
    _full_scan(monkeypatch)
    assert _picks(config, policy) == fast


def test_scalar_pairs_equal_the_full_tensor_with_twins():
    config = EpisodeConfig(cluster="hetero-1-x4", trace="bfcl_v3", num_workflows=60, load=0.5,
                           seed=4)
    checked = 0
    for dp in _decisions(config):
        for slot in range(len(dp.calls)):
            row = (dp.state.project_prefill(dp.batch) if dp.stage == Stage.PREFILL
                   else dp.state.project_decode(dp.batch))[slot]
            flat = int(np.argmin(row))
            p, d = divmod(flat, row.shape[1])
            call = dp.calls[slot]
            one = (dp.state.best_prefill_pair_one(call, call.pf_est) if dp.stage == Stage.PREFILL
                   else dp.state.best_decode_pair_one(call))
            assert one == (p, d, float(row.flat[flat]))
            checked += 1
    assert checked > 100
