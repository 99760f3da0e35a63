"""Offered prefill load and the arrival rate that gives it."""

from __future__ import annotations

import pytest

from hexagent_gym.planning.cluster_tables import ClusterTables
from hexagent_gym.sim.load import offered_load, pool_seconds, rate_for_load
from hexagent_gym.workload.workload import make_workflow
from tests.toy import ToyLatency, toy_cluster


def test_pool_seconds_hand_computed():
    fast, slow = ToyLatency(a=0.0, b=1e-4), ToyLatency(a=0.0, b=3e-4)
    tables = ClusterTables(toy_cluster(prefill=(fast, slow)))
    wf = make_workflow([(1000, 10, 0.0, []), (2000, 10, 0.0, [0])])
    # 1000 tokens: 0.1 s and 0.3 s in parallel -> 1 / (10 + 3.33) = 0.075 s; 2000 tokens: 0.15 s
    assert pool_seconds(tables, wf) == pytest.approx(0.075 + 0.15)
    assert offered_load(tables, [wf], 2.0) == pytest.approx(0.45)
    assert rate_for_load(tables, [wf], 0.45) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="load"):
        rate_for_load(tables, [wf], 0.0)
