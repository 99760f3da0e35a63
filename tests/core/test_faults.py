"""Instance faults (docs/faults.md): hand-computed cases on tiny clusters, the configuration's
validation, the seam's guard and the seeded MTBF/MTTR process."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from hexagent_gym.config import ConfigError
from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.experiments.cells import Cell
from hexagent_gym.planning.decisions import earliest_finish_pick
from hexagent_gym.planning.entities import CallState
from hexagent_gym.sim.faults import FaultPlan, parse_faults
from hexagent_gym.sim.fork import known_only
from hexagent_gym.sim.simulator import Simulator
from hexagent_gym.workload.arrivals import EpisodeWorkload
from hexagent_gym.workload.prompts import DEFAULT_BLOCK_TOKENS
from hexagent_gym.workload.workload import make_workflow
from tests.toy import ToyLatency, toy_cluster, workflow_with_reuse

LONE = make_workflow([(1000, 100, 0.0, [])], "lone")


def episode(*arrivals, spec=LONE):
    return EpisodeWorkload((spec,) * len(arrivals), np.array(arrivals, dtype=float),
                           np.arange(len(arrivals)))


def run(cluster, work, events=None, decisions=True, **faults):
    if events is not None:
        faults["events"] = events
    sim = Simulator(cluster, work, compute_horizons=False, decisions=decisions,
                    faults=faults or None)
    return sim, sim.run(earliest_finish_pick)


def ev(time, instance, kind, duration, **extra):
    return {"time": time, "instance": instance, "kind": kind, "duration": duration, **extra}


@pytest.mark.parametrize("decisions", [True, False])
def test_decode_failure_mid_decode_recomputes_the_call_after_recovery(decisions):
    # 1P1D: the call decodes from 0.112 s to 2.317 s alone. Its decode instance fails at 1 s
    # for 2 s; with no decode instance left the call waits, then starts over at 3 s (prefill,
    # transfer, decode): it finishes exactly 3 s after its fault-free finish, once.
    cluster = toy_cluster()
    base, _ = run(cluster, episode(0.0))
    c0 = base.workflows[0].calls[0]
    sim, res = run(cluster, episode(0.0), [ev(1.0, "decode:0", "fail", 2.0)], decisions)
    c = sim.workflows[0].calls[0]
    assert c.prefill_start == 3.0 and c.finish_t == pytest.approx(3.0 + c0.finish_t, abs=1e-12)
    assert sim.workflows[0].num_done == 1
    assert (res.fault_events, res.fault_reexecuted_calls, res.fault_replaced_calls) == (1, 1, 0)
    generated = (1.0 - c0.decode_start) / base.decode[0].latency.decode_step_time(1, 1049.5)
    assert res.fault_recomputed_tokens == pytest.approx(1000 + generated, rel=1e-3)


def test_prefill_failure_mid_prefill_restarts_on_the_other_instance():
    # 2P1D: the call prefills on p0 (0.11 s); p0 fails at 0.05 s, so the call prefills again
    # on p1 from 0.05 s and everything after shifts by 0.05 s.
    cluster = toy_cluster(prefill=(ToyLatency(), ToyLatency()))
    base, _ = run(cluster, episode(0.0))
    c0 = base.workflows[0].calls[0]
    assert c0.prefill_inst == 0
    sim, res = run(cluster, episode(0.0), [ev(0.05, "prefill:0", "fail", 10.0)])
    c = sim.workflows[0].calls[0]
    assert (c.prefill_inst, c.prefill_start) == (1, 0.05)
    assert c.finish_t == pytest.approx(0.05 + c0.finish_t, abs=1e-12)
    assert (res.fault_reexecuted_calls, res.fault_recomputed_tokens) == (1, 1000)


def test_drain_lets_running_work_finish_and_places_new_work_elsewhere():
    cluster = toy_cluster(decode=(ToyLatency(), ToyLatency()))
    base, _ = run(cluster, episode(0.0, 0.5))
    assert [w.calls[0].decode_inst for w in base.workflows] == [0, 1]
    # d0 drained while the first call decodes there: it finishes there, as without the drain
    sim, res = run(cluster, episode(0.0, 0.5), [ev(0.3, "decode:0", "drain", 5.0)])
    first = sim.workflows[0].calls[0]
    assert first.decode_inst == 0 and first.finish_t == base.workflows[0].calls[0].finish_t
    assert res.fault_reexecuted_calls == 0
    # d1 drained: the second call goes to the busy d0 instead
    sim, res = run(cluster, episode(0.0, 0.5), [ev(0.3, "decode:1", "drain", 5.0)])
    assert [w.calls[0].decode_inst for w in sim.workflows] == [0, 0]


def test_drain_replaces_calls_only_planned_on_the_instance():
    # two calls at once on 1P2D: the second is planned on d1 behind the first's prefill; d1 is
    # drained before its prefill starts, so it is re-placed (nothing lost) on d0
    cluster = toy_cluster(decode=(ToyLatency(), ToyLatency()))
    base, _ = run(cluster, episode(0.0, 0.0))
    assert [w.calls[0].decode_inst for w in base.workflows] == [0, 1]
    sim, res = run(cluster, episode(0.0, 0.0), [ev(0.01, "decode:1", "drain", 5.0)])
    assert [w.calls[0].decode_inst for w in sim.workflows] == [0, 0]
    assert (res.fault_replaced_calls, res.fault_reexecuted_calls) == (1, 0)


def test_a_straggler_runs_its_prefill_at_the_factor():
    cluster = toy_cluster()
    base, _ = run(cluster, episode(0.0))
    c0 = base.workflows[0].calls[0]
    sim, _ = run(cluster, episode(0.0), [ev(0.0, "prefill:0", "slow", 10.0, factor=0.5)])
    c = sim.workflows[0].calls[0]
    assert c.prefill_end - c.prefill_start == pytest.approx(2 * (c0.prefill_end - 0.0))
    # slowed from the middle of the prefill: the remaining half takes twice as long
    sim, _ = run(cluster, episode(0.0), [ev(0.055, "prefill:0", "slow", 10.0, factor=0.5)])
    assert sim.workflows[0].calls[0].prefill_end == pytest.approx(0.055 + 2 * 0.055)


def test_a_decode_straggler_stretches_the_slowed_period():
    # half speed for 1 s in the middle of a 2.2 s decode: 0.5 s of work done in 1 s, so about
    # 0.5 s more (the step time is re-rated at each speed change, as at any batch change)
    cluster = toy_cluster()
    base, _ = run(cluster, episode(0.0))
    sim, _ = run(cluster, episode(0.0), [ev(0.5, "decode:0", "slow", 1.0, factor=0.5)])
    delay = sim.workflows[0].calls[0].finish_t - base.workflows[0].calls[0].finish_t
    assert delay == pytest.approx(0.5, abs=0.005)
    assert sim.decode[0].latency is base.decode[0].latency  # back to full speed


def test_a_recovered_instance_takes_work_again():
    cluster = toy_cluster(decode=(ToyLatency(), ToyLatency()))
    sim, res = run(cluster, episode(0.0, 5.0), [ev(0.0, "decode:0", "fail", 1.0)])
    assert [w.calls[0].decode_inst for w in sim.workflows] == [1, 0]
    assert res.fault_events == 1 and res.fault_reexecuted_calls == 0


def test_work_waits_while_no_prefill_instance_is_up():
    cluster = toy_cluster()
    sim, _ = run(cluster, episode(0.0), [ev(0.0, "prefill:0", "drain", 4.0)])
    assert sim.workflows[0].calls[0].prefill_start == 4.0


def test_picking_an_unavailable_instance_names_it():
    cluster = toy_cluster(prefill=(ToyLatency(), ToyLatency()), decode=(ToyLatency(),) * 2)
    sim = Simulator(cluster, episode(1.0), compute_horizons=False,
                    faults={"events": [ev(0.0, "prefill:0", "fail", 9.0),
                                       ev(0.0, "decode:1", "drain", 9.0)]})
    dp = sim.run_until_decision()
    assert not dp.feasible(0)[0].any() and not dp.feasible(0)[:, 1].any()
    with pytest.raises(ValueError, match="prefill instance 0 is unavailable"):
        dp.pick(0, 0, 0)
    with pytest.raises(ValueError, match="decode instance 1 is unavailable"):
        dp.pick(0, 1, 1)
    dp.pick(0, 1, 0)


def test_no_faults_installs_nothing():
    sim = Simulator(toy_cluster(), episode(0.0), compute_horizons=False)
    assert sim._faults is None
    assert not {"_open_decision", "_apply", "_place_fallback"} & set(vars(sim))
    sim = Simulator(toy_cluster(), episode(0.0), compute_horizons=False,
                    faults={"events": [ev(0.0, "decode:0", "slow", 1.0, factor=0.5)]})
    sim.run(close=True)
    assert sim._faults is None and "_open_decision" not in vars(sim)


def test_mtbf_same_seed_same_result_and_policies_share_the_fault_times():
    cfg = EpisodeConfig(cluster="tiny-2p2d", trace="bfcl_v3", num_workflows=40, load=1.0,
                        faults={"mtbf": 1.0, "mttr": 0.3, "kinds": ["fail", "drain", "slow"]})
    factory = EpisodeFactory(cfg)

    def result(seed):
        r = factory.simulator(seed).run(close=True).to_dict(include_records=False)
        return {k: v for k, v in r.items() if "seconds" not in k and "_ms_" not in k}

    first = result(3)
    assert first == result(3) and first["fault_events"] > 0
    assert first != result(4)


def test_a_schedulers_fork_forgets_future_faults():
    cluster = toy_cluster()
    sim = Simulator(cluster, episode(0.0), compute_horizons=False,
                    faults={"events": [ev(1.0, "decode:0", "fail", 2.0)], "mtbf": 5.0,
                            "mttr": 1.0})
    sim.run_until_decision()
    fork = copy.deepcopy(sim)
    known_only(fork)
    assert not [e for e in fork.events.heap if e[1] == 9]
    assert len([e for e in sim.events.heap if e[1] == 9]) == 3


@pytest.mark.parametrize("faults, match", [
    ({"events": [ev(1.0, "decode:9", "fail", 1.0)]}, r"faults.events\[0\].instance 'decode:9' "
                                                     r"does not exist.*decode:0..7"),
    ({"events": [ev(-1.0, "decode:0", "fail", 1.0)]}, r"faults.events\[0\].time must be"),
    ({"events": [ev(1.0, "decode:0", "fail", float("nan"))]}, r"duration must be a finite"),
    ({"events": [ev(1.0, "decode:0", "crash", 1.0)]}, r"kind: unknown 'crash'"),
    ({"events": [ev(1.0, "gpu:0", "fail", 1.0)]}, r"'prefill:<i>' or 'decode:<i>'"),
    ({"events": [ev(1.0, "decode:0", "slow", 1.0)]}, r"needs 'factor'"),
    ({"events": [ev(1.0, "decode:0", "slow", 1.0, factor=2.0)]}, r"factor must be .* <= 1"),
    ({"events": [ev(1.0, "decode:0", "fail", 1.0, factor=0.5)]}, r"only a 'slow' event"),
    ({"mtbf": 10.0}, r"needs both mtbf and mttr"),
    ({"mtbf": float("inf"), "mttr": 1.0}, r"mtbf must be a finite number > 0"),
    ({"mtbf": 1.0, "mttr": 1.0, "kinds": ["fail", "reboot"]}, r"kinds: unknown 'reboot'"),
    ({"mtbf": 1.0, "mttr": 1.0, "mtbf_s": 1.0}, r"unknown key 'mtbf_s'"),
    ([1, 2], r"must be null or a mapping"),
])
def test_bad_fault_settings_name_the_field(faults, match):
    with pytest.raises(ConfigError, match=match):
        EpisodeConfig(cluster="hetero-1", faults=faults)


def test_fault_settings_are_hashable_and_cells_without_faults_keep_their_keys():
    cfg = EpisodeConfig(faults={"events": [ev(2.0, "decode:1", "fail", 1.0),
                                           ev(1.0, "prefill:0", "drain", 1.0)]})
    assert isinstance(cfg.faults, FaultPlan) and hash(cfg) == hash(cfg.replace())
    assert [e.time for e in cfg.faults.events] == [1.0, 2.0]  # in time order
    assert parse_faults({"events": []}) is None and EpisodeConfig(faults={}).faults is None
    assert "faults" not in Cell("fcfs", EpisodeConfig()).params["episode"]
    assert Cell("fcfs", cfg).params["episode"]["faults"]["events"][0]["kind"] == "drain"


@pytest.mark.parametrize("decisions", [True, False])
def test_a_sample_group_cut_by_a_failure_serves_its_unfinished_samples_alone(decisions):
    # three samples of one request (outputs 10, 60, 200 tokens) decode together on d0; d0 fails
    # after the first finished: the other two are served again on d1, each on its own
    group = workflow_with_reuse([(300, n, [], {"sample_group": "g"}) for n in (10, 60, 200)]
                                + [(200, 20, [0, 1, 2], {})], "g", block=DEFAULT_BLOCK_TOKENS)
    cluster = toy_cluster(decode=(ToyLatency(), ToyLatency()))
    base, _ = run(cluster, episode(0.0, spec=group), decisions=decisions)
    first = base.workflows[0].calls[0]
    fail_at = first.finish_t + 0.1
    sim, res = run(cluster, episode(0.0, spec=group), [ev(fail_at, "decode:0", "fail", 50.0)],
                   decisions)
    calls = sim.workflows[0].calls
    assert sim.workflows[0].num_done == 4 and all(c.state == CallState.DONE for c in calls)
    assert calls[0].finish_t == first.finish_t and calls[0].decode_inst == 0
    assert [c.decode_inst for c in calls[1:3]] == [1, 1] and min(
        c.prefill_start for c in calls[1:3]) >= fail_at
    assert calls[1].lead is None and calls[2].lead is None  # served as calls of their own
    assert res.fault_reexecuted_calls == 2
