"""Decode admission on predicted demand and preemption when the true KV outgrows it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hexagent_gym.planning.decisions import Stage
from hexagent_gym.planning.entities import CallState
from hexagent_gym.sim.simulator import Simulator
from hexagent_gym.workload.workload import make_workflow
from tests.toy import FixedPredictor as Fixed
from tests.toy import ToyLatency, toy_cluster
from tests.toy import toy_episode as episode
from tests.toy import workflow_with_reuse as wf

LM = ToyLatency()
SETUP, SPT = 0.001, 1e-6




@dataclass(frozen=True)
class Scaled:
    """Predicts ``round(factor · L)`` (at least 1): under- or over-estimates every call."""

    factor: float
    name: str = "scaled"

    def predict(self, true, rng):
        return np.maximum(1, np.rint(np.asarray(true) * self.factor)).astype(np.int64)




def two_long_calls(**kwargs):
    # two 100-token prompts generating 300 tokens each, predicted at 50: both are admitted
    # (150 + 150 reserved of 600), their true KV reaches 600 when each has generated 200
    a = make_workflow([(100, 300, 0.0, [])], "a")
    b = make_workflow([(100, 300, 0.0, [])], "b")
    # two prefill instances: both prompts are ready for decode at the same instant
    sim = Simulator(toy_cluster(prefill=(LM, LM), capacity=600), episode(a, b), **kwargs)
    res = sim.run()
    return sim, res


def test_an_underpredicted_call_is_preempted_and_finishes_exactly_once():
    sim, res = two_long_calls(length_predictor=Fixed(50))
    a, b = sim.workflows[0].calls[0], sim.workflows[1].calls[0]
    assert a.decode_start == b.decode_start  # both admitted on their predicted demand
    assert res.preemptions == 1 and (a.preempted, b.preempted) == (0, 1)  # LIFO: b goes
    assert b.generated == pytest.approx(200.0)  # it keeps what it made
    assert a.state == b.state == CallState.DONE and b.finish_t > a.finish_t
    assert all(w.num_done == 1 for w in sim.workflows)
    assert res.decode_kv_peak == pytest.approx(1.0)
    # b waited from its preemption until a finished (memory freed), not before it started
    assert 0.0 < b.decode_wait < a.finish_t - b.decode_start
    assert sim.decode[0].used_kv == 0 and sim.decode[0].true_base == pytest.approx(0.0)


def test_reserving_true_demand_never_preempts():
    sim, res = two_long_calls(length_predictor=Fixed(50), decode_admission="true-demand")
    a, b = sim.workflows[0].calls[0], sim.workflows[1].calls[0]
    assert res.preemptions == 0 and b.decode_start >= a.finish_t  # 400 + 400 > 600: b waits
    assert res.decode_kv_delayed == pytest.approx(0.5)  # b was held back by KV


def test_the_oracle_never_preempts_and_matches_true_reservations():
    sim, res = two_long_calls()
    ref, ref_res = two_long_calls(decode_admission="true-demand")
    assert res.preemptions == 0
    np.testing.assert_array_equal(res.ratios, ref_res.ratios)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 400), st.integers(1, 300), st.integers(0, 2)),
                min_size=1, max_size=6),
       st.integers(2, 5), st.sampled_from([0.3, 0.7, 1.0, 1.5]),
       st.integers(800, 3000), st.integers(1, 3), st.booleans())
def test_random_dags_every_call_completes_once_and_kv_never_exceeds_capacity(
        rows, n_wf, factor, capacity, n_dec, small_batch):
    calls = [(n_in, n_out, 0.0, [i - 1 - back] if i - 1 - back >= 0 else [])
             for i, (n_in, n_out, back) in enumerate(rows)]
    flows = [make_workflow(calls, f"w{k}") for k in range(n_wf)]
    cluster = toy_cluster(prefill=(LM, LM), decode=(LM,) * n_dec, capacity=capacity,
                          max_batch=4 if small_batch else 64)
    sim = Simulator(cluster, episode(*flows, arrivals=0.02 * np.arange(n_wf)),
                    length_predictor=Scaled(factor))
    res = sim.run()
    assert all(w.num_done == len(w.calls) for w in sim.workflows)
    assert all(c.state == CallState.DONE for w in sim.workflows for c in w.calls)
    assert res.preemptions == sum(c.preempted for w in sim.workflows for c in w.calls) >= 0
    assert res.decode_kv_peak <= 1.0 + 1e-9
    for d in sim.decode:
        assert d.used_kv == 0 and abs(d.true_base) < 1e-6 and not d.batch
    if factor >= 1.0:
        assert res.preemptions == 0  # nothing outgrows an over-estimate


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.integers(1, 200), st.booleans()),
                min_size=2, max_size=7), st.sampled_from([0.2, 0.5]), st.integers(1700, 3000))
def test_sample_groups_and_preemptable_calls_share_an_instance_safely(rows, factor, capacity):
    calls = []
    for i, (n_in, n_out, group) in enumerate(rows):
        if group and calls:  # another sample of the previous request
            p_in, _, p_parents, p_extra = calls[-1]
            p_extra.setdefault("sample_group", f"g{i}")
            calls.append((p_in, n_out, p_parents, dict(p_extra)))
        else:
            calls.append((n_in, n_out, [i - 1] if i else [], {}))
    flows = [wf(calls, f"w{k}", block=64) for k in range(4)]
    sim = Simulator(toy_cluster(prefill=(LM, LM), capacity=capacity, prefill_kv=4096),
                    episode(*flows, arrivals=0.01 * np.arange(4)),
                    length_predictor=Scaled(factor))
    res = sim.run()
    assert all(w.num_done == len(w.calls) for w in sim.workflows)
    assert res.decode_kv_peak <= 1.0 + 1e-9
    assert all(c.preempted == 0 for w in sim.workflows for c in w.calls if c.width > 1
               or c.lead is not None)  # a group reserves its true demand: never preempted
    d = sim.decode[0]
    assert d.used_kv == 0 and abs(d.true_base) < 1e-6


def pinned_to_d0_then(decode_choice):
    """A pick function placing every prefill on decode instance 0, then ``decode_choice``."""
    def pick(dp):
        slot = dp.remaining[0]
        call = dp.calls[slot]
        if dp.stage == Stage.PREFILL:
            return slot, call.index % 2, 0
        return decode_choice(dp, slot)
    return pick


def argmin_pair(dp, slot):
    row = dp.delta_row(slot)
    p, d = divmod(int(np.argmin(row)), row.shape[1])
    return slot, p, d


def test_a_free_call_moves_when_its_instance_cannot_admit_it():
    # a long call fills decode instance 0; a second one planned there cannot be admitted when
    # its KV arrives, so the plan moves it to the idle instance 1 (its KV is sent again)
    a = make_workflow([(500, 400, 0.0, [])], "a")
    b = make_workflow([(400, 50, 0.0, [])], "b")
    cluster = toy_cluster(prefill=(LM, LM), decode=(LM, LM), capacity=1000)
    sim = Simulator(cluster, episode(a, b, arrivals=[0.0, 0.07]))  # b after a is admitted
    res = sim.run(pinned_to_d0_then(argmin_pair))
    ca, cb = sim.workflows[0].calls[0], sim.workflows[1].calls[0]
    assert ca.decode_inst == 0 and cb.decode_inst == 1 and res.decode_moves == 1
    resend = SETUP + 400 * SPT
    assert cb.transfer_end == pytest.approx(cb.prefill_end + 2 * resend)  # sent twice
    assert cb.decode_start == pytest.approx(cb.transfer_end) and cb.finish_t < ca.finish_t
    # with moves off it waits for a
    sim_off = Simulator(cluster, episode(a, b, arrivals=[0.0, 0.07]), free_decode_calls=False)
    sim_off.run(pinned_to_d0_then(argmin_pair))
    assert sim_off.workflows[1].calls[0].decode_start >= sim_off.workflows[0].calls[0].finish_t


def test_a_preempted_call_is_locked_to_its_instance():
    seen = []

    def decode_choice(dp, slot):
        call = dp.calls[slot]
        if call.preempted:
            assert dp.feasible(slot).sum() == 1  # only its own pair
            with pytest.raises(ValueError, match="locked to"):
                dp.pick(slot, call.prefill_inst, 1)
            seen.append(call.uid)
        return argmin_pair(dp, slot)

    a = make_workflow([(100, 300, 0.0, [])], "a")
    b = make_workflow([(100, 300, 0.0, [])], "b")
    cluster = toy_cluster(prefill=(LM, LM), decode=(LM, LM), capacity=600)
    sim = Simulator(cluster, episode(a, b), length_predictor=Fixed(50))
    res = sim.run(pinned_to_d0_then(decode_choice))
    victim = sim.workflows[1].calls[0]
    assert res.preemptions == 1 and seen == [victim.uid] and victim.decode_inst == 0
    assert all(w.num_done == 1 for w in sim.workflows)
