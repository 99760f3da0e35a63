"""Every built-in policy makes the same decisions as before the scale and layout work.

The hashes in ``tests/fixtures/decision_hashes.json`` were recorded at commit 5e19231, before
class-reduced projections, scalar one-call picks, cut-cluster horizons and the split of the
simulator and the planner. Each covers one episode's per-call placements and times, every
workflow's arrival, finish and horizon, and the decision, invocation, move, preemption and
cache counters. A change that alters any of them on purpose must say so and re-record the file
(the way ``.ci/baseline.json`` is updated).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.policy import make_policy, run_policy

HASHES = json.loads((Path(__file__).parent / "fixtures" / "decision_hashes.json").read_text())
CASES = {
    0: dict(cluster="hetero-1", trace="bfcl_v3", num_workflows=60, load=1.0),
    1: dict(cluster="hetero-1", trace="sharegpt", num_workflows=60, load=1.0),
    2: dict(cluster="hetero-1", trace="lats", num_workflows=60, load=1.0),
    3: dict(cluster="hetero-1", trace="mixed", num_workflows=60, load=1.0),
    6: dict(cluster="hetero-2", trace="mixed", num_workflows=60, load=1.2, estimation_error=0.2),
    7: dict(cluster="hetero-1", trace="bfcl_v3", num_workflows=60, load=1.0, prefix_cache=False,
            parallel_sampling=False, length_predictor="oracle", free_decode_calls=False),
    8: dict(cluster="hetero-1", trace="lats", num_workflows=60, load=1.0,
            max_calls_per_decision=4),
    9: dict(cluster="hetero-1", trace="bfcl_v3", num_workflows=60, load=1.0,
            planning_latency=0.01),
    10: dict(cluster="hetero-1-lowmem", trace="agent_sessions", num_workflows=40, load=1.0),
    11: dict(cluster="tiny-2p2d", trace="mixed", num_workflows=30, load=1.0),
}


def episode_hash(case: dict, policy: str) -> str:
    sim = EpisodeFactory(EpisodeConfig(**case, seed=3)).simulator()
    result = run_policy(sim, make_policy(policy))
    flows = [(w.arrival, w.finish_t, w.horizon) for w in sim.workflows]
    calls = [(c.prefill_inst, c.decode_inst, c.prefill_start, c.decode_start, c.finish_t)
             for w in sim.workflows for c in w.calls]
    counters = (result.decisions, result.invocations, sim.moves, sim.preemptions,
                sim.cached_tokens)
    return hashlib.sha256(repr((flows, calls, *counters)).encode()).hexdigest()


@pytest.mark.parametrize("case", sorted(CASES))
def test_policies_decide_as_before(case):
    policies = sorted({key.split(":")[1] for key in HASHES if key.startswith(f"{case}:")})
    assert len(policies) == 11
    changed = [p for p in policies if episode_hash(CASES[case], p) != HASHES[f"{case}:{p}"]]
    assert not changed, f"case {case} ({CASES[case]}): decisions changed for {changed}"
