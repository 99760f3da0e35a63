"""Episode sampling and arrival processes (hexagent_gym.workload.arrivals)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from hexagent_gym.workload.arrivals import EpisodeWorkload, sample_episode
from hexagent_gym.workload.workload import Trace, load_trace, make_workflow


def small_trace(n: int = 10, arrivals: list[float | None] | None = None) -> Trace:
    workflows = []
    for k in range(n):
        w = make_workflow([(10 + k, 5, 0.0, []), (20 + k, 5, 0.1, [0])], workflow_id=f"w{k}")
        if arrivals is not None:
            w = dataclasses.replace(w, arrival_s=arrivals[k], line=k + 1)
        workflows.append(w)
    return Trace(name="small", source="<test>", workflows=tuple(workflows))


def same_episode(a: EpisodeWorkload, b: EpisodeWorkload) -> bool:
    return (a.workflows == b.workflows and np.array_equal(a.arrivals, b.arrivals)
            and np.array_equal(a.trace_indices, b.trace_indices))


def test_episode_arrays_are_typed_aligned_and_read_only() -> None:
    trace = small_trace()
    ep = sample_episode(trace, 6, np.random.default_rng(0), arrival_rate=2.0)
    assert len(ep) == len(ep.workflows) == 6
    assert ep.arrivals.dtype == np.float64 and ep.trace_indices.dtype == np.int64
    assert ep.arrivals.shape == ep.trace_indices.shape == (6,)
    assert all(trace.workflows[i] is w for i, w in zip(ep.trace_indices, ep.workflows, strict=True))
    assert ep.arrivals[0] > 0 and np.all(np.diff(ep.arrivals) >= 0)
    with pytest.raises(ValueError):
        ep.arrivals[0] = 1.0
    with pytest.raises(ValueError):
        ep.trace_indices[0] = 1


def test_same_seed_same_episode_different_seed_different_episode() -> None:
    trace = load_trace("bfcl_v3")
    a = sample_episode(trace, 400, np.random.default_rng(123), 40.0)
    b = sample_episode(trace, 400, np.random.default_rng(123), 40.0)
    c = sample_episode(trace, 400, np.random.default_rng(124), 40.0)
    assert same_episode(a, b)
    assert not np.array_equal(a.trace_indices, c.trace_indices)
    assert not np.array_equal(a.arrivals, c.arrivals)


def test_only_the_given_rng_is_used() -> None:
    np.random.seed(7)
    before = np.random.get_state()[1].copy()
    sample_episode(small_trace(), 5, np.random.default_rng(1), 3.0)
    assert np.array_equal(np.random.get_state()[1], before)


def test_sampling_without_replacement() -> None:
    trace = small_trace(10)
    rng = np.random.default_rng(5)
    for n in (1, 3, 7, 10):
        ep = sample_episode(trace, n, rng, 1.0)
        assert len(set(ep.trace_indices.tolist())) == n
    whole = sample_episode(trace, None, np.random.default_rng(5), 1.0)
    assert sorted(whole.trace_indices.tolist()) == list(range(10))
    orders = {tuple(sample_episode(trace, None, np.random.default_rng(s), 1.0).trace_indices)
              for s in range(5)}
    assert len(orders) > 1  # None is a random permutation, not file order


def test_more_workflows_than_the_trace_concatenates_permutations() -> None:
    trace = small_trace(10)
    ep = sample_episode(trace, 25, np.random.default_rng(9), 1.0)
    idx = ep.trace_indices.tolist()
    assert sorted(idx[:10]) == list(range(10)) and sorted(idx[10:20]) == list(range(10))
    assert len(set(idx[20:])) == 5
    counts = np.bincount(ep.trace_indices, minlength=10)
    assert set(counts.tolist()) <= {2, 3} and counts.sum() == 25


def test_poisson_gaps_have_mean_one_over_rate() -> None:
    rate, n = 40.0, 20_000
    ep = sample_episode(small_trace(10), n, np.random.default_rng(2024), rate)
    gaps = np.diff(np.concatenate([[0.0], ep.arrivals]))
    assert np.all(gaps >= 0) and ep.arrivals[0] == gaps[0] > 0
    # Mean of n Exponential(1/rate) gaps: standard error (1/rate)/sqrt(n); allow 4 of them.
    assert abs(gaps.mean() - 1 / rate) < 4 * (1 / rate) / math.sqrt(n)
    # Exponential gaps: the standard deviation equals the mean (coefficient of variation 1).
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.05
    assert np.bincount(ep.trace_indices).tolist() == [2000] * 10


def test_replay_uses_file_arrivals_in_arrival_order() -> None:
    trace = small_trace(4, arrivals=[5.0, 1.0, 3.0, 1.0])
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    ep = sample_episode(trace, None, rng, arrival_rate=None)
    assert ep.trace_indices.tolist() == [1, 3, 2, 0]  # ties keep file order
    assert ep.arrivals.tolist() == [1.0, 1.0, 3.0, 5.0]
    assert [w.workflow_id for w in ep.workflows] == ["w1", "w3", "w2", "w0"]
    assert rng.bit_generator.state == state  # replay draws nothing
    first_two = sample_episode(trace, 2, rng, None)
    assert first_two.trace_indices.tolist() == [1, 3]
    with pytest.raises(ValueError, match="only 4 workflows"):
        sample_episode(trace, 5, rng, None)


def test_replay_without_arrival_times_says_to_pass_a_rate() -> None:
    trace = small_trace(3, arrivals=[0.0, None, 2.0])
    with pytest.raises(ValueError, match="no arrival times") as info:
        sample_episode(trace, None, np.random.default_rng(0), None)
    assert "arrival_rate" in str(info.value) and "'w1'" in str(info.value)
    with pytest.raises(ValueError, match="no arrival times"):
        sample_episode(load_trace("sharegpt"), 10, np.random.default_rng(0), None)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "3"])
def test_num_workflows_must_be_positive(bad: object) -> None:
    with pytest.raises(ValueError, match="num_workflows"):
        sample_episode(small_trace(), bad, np.random.default_rng(0), 1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0.0, -2.0, math.nan, math.inf, True, "10"])
def test_arrival_rate_must_be_positive_and_finite(bad: object) -> None:
    with pytest.raises(ValueError, match="arrival_rate"):
        sample_episode(small_trace(), 3, np.random.default_rng(0), bad)  # type: ignore[arg-type]


def test_rng_must_be_a_generator() -> None:
    with pytest.raises(TypeError, match="Generator"):
        sample_episode(small_trace(), 3, 0, 1.0)  # type: ignore[arg-type]


def test_paper_sized_episodes_on_shipped_traces() -> None:
    for name, n, rate in (("sharegpt", 100, 10.0), ("bfcl_v3", 400, 40.0), ("lats", 100, 40.0),
                          ("mixed", 100, 10.0)):
        ep = sample_episode(load_trace(name), n, np.random.default_rng(0), rate)
        assert len(ep) == n and len(set(ep.trace_indices.tolist())) == n
        # n arrivals at rate r span about n / r seconds.
        assert 0.5 * n / rate < ep.arrivals[-1] < 1.5 * n / rate
