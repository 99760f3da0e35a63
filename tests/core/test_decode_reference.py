"""The decode rate model against the per-token reference."""

from __future__ import annotations

import numpy as np
import pytest

from hexagent_gym.cluster.latency import LatencyModel
from hexagent_gym.sim.decode_reference import (
    DecodeJob,
    compare,
    per_token_finish_times,
    rate_model_finish_times,
)
from tests.toy import ToyLatency

LM = ToyLatency()


def test_lone_call_is_exact_when_step_time_is_linear_in_context():
    jobs = [DecodeJob(0.5, 1000, 100)]
    ref = per_token_finish_times(LM, jobs, 10**9, 8)
    expected = 0.5 + sum(LM.decode_step_time(1, 1000 + k) for k in range(100))
    assert ref[0] == pytest.approx(expected, rel=1e-12)
    assert rate_model_finish_times(LM, jobs, 10**9, 8)[0] == pytest.approx(expected, rel=1e-12)


def test_capacity_serialises_both_models_identically_for_lone_calls():
    jobs = [DecodeJob(0.0, 1000, 50), DecodeJob(0.0, 1000, 50)]
    ref = per_token_finish_times(LM, jobs, 1100, 8)
    rate = rate_model_finish_times(LM, jobs, 1100, 8)
    assert ref[1] == pytest.approx(2 * ref[0], rel=1e-12)
    np.testing.assert_allclose(rate, ref, rtol=1e-12)


def test_rate_model_error_is_small_on_a_busy_instance():
    rng = np.random.default_rng(0)
    n = 120
    jobs = [DecodeJob(float(t), int(i), int(o)) for t, i, o in
            zip(np.cumsum(rng.exponential(0.05, n)), rng.integers(200, 6000, n),
                rng.integers(5, 400, n), strict=True)]
    err = compare(LatencyModel("llama-3.1-70b", "h100", 4), jobs)
    assert err["mean_rel_error"] < 0.02
    assert err["makespan_rel_error"] < 0.01
    assert err["max_rel_error"] > 0.0  # the models do differ: joins mid-step, fixed rates
