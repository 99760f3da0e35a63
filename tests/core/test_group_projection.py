"""A sample group is projected with its whole predicted KV demand, as Ŝ reserves it.

The group's leader decodes for every sample, and Ŝ commits (and later releases) the group's
``L_in + Σ L̂_out``. The projections used to price the leader's admission with ``L_in +`` its
longest sample only, so a group could look admissible now on an instance that cannot hold it.
"""

from __future__ import annotations

import numpy as np

from hexagent_gym.planning.decisions import Stage
from hexagent_gym.sim.simulator import Simulator
from tests.toy import FixedPredictor, ToyLatency, toy_cluster, toy_episode
from tests.toy import workflow_with_reuse as wf


def _decision_for_group():
    lm = ToyLatency()
    # one decode instance of 1,000 tokens; workflow a (600 in, 100 predicted out: 700 tokens)
    # holds it while the group b arrives: 3 samples of 100 in, 100 predicted out each
    cluster = toy_cluster(prefill=(lm, lm), decode=(lm,), capacity=1000)
    a = wf([(600, 100, [], {})], "a")
    b = wf([(100, 100, [], {"sample_group": "g"})] * 3, "b")
    sim = Simulator(cluster, toy_episode(a, b, arrivals=[0.0, 0.001]),
                    length_predictor=FixedPredictor(100))
    dp = sim.run_until_decision()
    while dp is not None:
        leaders = [i for i, c in enumerate(dp.calls) if c.width > 1]
        if dp.stage == Stage.PREFILL and leaders:
            return dp, leaders[0]
        while not dp.done:
            slot = dp.picked.index(False)
            dp.pick(slot, *dp.best_pair(slot)[:2])
        dp = sim.run_until_decision()
    raise AssertionError("the group never waited for prefill")


def test_the_leader_is_projected_with_the_groups_demand():
    dp, slot = _decision_for_group()
    lead = dp.calls[slot]
    assert lead.width == 3 and lead.kv_pred == 100 + 3 * 100
    assert dp.batch.kv_pred[slot] == 400.0
    # 700 of 1,000 tokens are committed: 400 do not fit now, 200 would have
    assert dp.state.dec_tokens_l[0] == 700
    start = dp.state.decode_starts(dp.batch.kv_pred)
    assert not isinstance(start, float) and start[slot, 0] > dp.now
    assert dp.state.decode_starts(np.array([200.0])) == dp.now


def test_scalar_and_vector_projections_agree_for_the_group():
    dp, slot = _decision_for_group()
    row = dp.state.project_prefill(dp.batch)[slot]
    flat = int(np.argmin(row))
    p, d = divmod(flat, row.shape[1])
    lead = dp.calls[slot]
    assert dp.state.best_prefill_pair_one(lead, lead.pf_est) == (p, d, float(row.flat[flat]))
    assert row.min() > dp.state.decode_starts(dp.batch.kv_pred)[slot, 0] - dp.now
