"""Every shipped policy serves an episode whose instances fail, drain and slow down
(docs/faults.md): the seam offers none of the unavailable instances, so no policy picks one."""

from __future__ import annotations

import pytest

from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.policy import make_policy, policy_names, run_policy

FAULTS = {"events": [{"time": 0.3, "instance": "decode:0", "kind": "fail", "duration": 1.0},
                     {"time": 0.2, "instance": "prefill:1", "kind": "drain", "duration": 1.0}],
          "mtbf": 1.0, "mttr": 0.3, "kinds": ["fail", "drain", "slow"]}
SLOW = {"learned"}  # loads torch and the shipped model (tests/agents/test_learned.py)


@pytest.fixture(scope="module")
def factory():
    return EpisodeFactory(EpisodeConfig(cluster="tiny-2p2d", trace="bfcl_v3", num_workflows=6,
                                        load=1.0, seed=1, faults=FAULTS))


@pytest.mark.parametrize("name", sorted(set(policy_names()) - SLOW))
def test_every_policy_serves_every_workflow_under_faults(factory, name):
    res = run_policy(factory.simulator(), make_policy(name), close=True)
    assert res.num_workflows == 6 and res.fault_events >= 2
