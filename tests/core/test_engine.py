"""Hand-computed lifecycle cases for the simulator core (toy linear latency models)."""

from __future__ import annotations

import pytest

from hexagent_gym.planning.entities import CallState
from hexagent_gym.sim.simulator import Simulator
from hexagent_gym.workload.workload import make_workflow
from tests.toy import ToyLatency, toy_cluster
from tests.toy import toy_episode as episode

LM = ToyLatency()
SETUP, SPT = 0.001, 1e-6




def lone_decode(l_in, l_out, lm=LM, batch=1):
    """Decode seconds of a call alone: L_out steps at the mean context of its lifetime."""
    return l_out * lm.decode_step_time(batch, l_in + (l_out - 1) / 2)


def test_one_call_completion_is_prefill_plus_transfer_plus_decode():
    wf = make_workflow([(1000, 100, 0.0, [])])
    sim = Simulator(toy_cluster(), episode(wf))
    res = sim.run()
    expected = LM.prefill_time(1000) + (SETUP + 1000 * SPT) + lone_decode(1000, 100)
    call = sim.workflows[0].calls[0]
    assert call.prefill_end == pytest.approx(LM.prefill_time(1000), abs=1e-12)
    assert call.transfer_end - call.prefill_end == pytest.approx(SETUP + 1000 * SPT, abs=1e-12)
    assert sim.workflows[0].finish_t == pytest.approx(expected, abs=1e-12)
    assert res.ratios[0] == pytest.approx(1.0, abs=1e-12)
    assert res.num_calls == 1


def test_two_calls_share_the_decode_batch_rate_changes_only_at_batch_changes():
    a = make_workflow([(1000, 100, 0.0, [])], "a")
    b = make_workflow([(1000, 100, 0.0, [])], "b")
    sim = Simulator(toy_cluster(), episode(a, b))
    sim.run()
    pf = LM.prefill_time(1000)
    x = SETUP + 1000 * SPT
    t_a, t_b = pf + x, 2 * pf + x  # prefill is single-server: b waits for a
    s1 = LM.decode_step_time(1, 1000 + 99 / 2)
    g = (t_b - t_a) / s1  # tokens a generated alone
    s2 = LM.decode_step_time(2, 2099 + g / 2)  # mean batch context over the remaining steps
    fin_a = t_b + (100 - g) * s2
    s3 = LM.decode_step_time(1, 1099.5 - g / 2)
    fin_b = fin_a + g * s3
    ca, cb = sim.workflows[0].calls[0], sim.workflows[1].calls[0]
    assert ca.decode_start == pytest.approx(t_a, abs=1e-12)
    assert cb.decode_start == pytest.approx(t_b, abs=1e-12)
    assert ca.finish_t == pytest.approx(fin_a, rel=1e-12)
    assert cb.finish_t == pytest.approx(fin_b, rel=1e-12)


def test_kv_capacity_admission_waits_for_release():
    a = make_workflow([(1000, 100, 0.0, [])], "a")
    b = make_workflow([(1000, 100, 0.0, [])], "b")
    sim = Simulator(toy_cluster(capacity=1500), episode(a, b))
    sim.run()
    ca, cb = sim.workflows[0].calls[0], sim.workflows[1].calls[0]
    assert cb.transfer_end < ca.finish_t  # b was ready before a finished ...
    assert cb.decode_start == ca.finish_t  # ... but only fits once a releases its KV
    assert cb.finish_t == pytest.approx(ca.finish_t + lone_decode(1000, 100), rel=1e-12)


def test_max_batch_size_limits_the_batch():
    a = make_workflow([(1000, 100, 0.0, [])], "a")
    b = make_workflow([(1000, 100, 0.0, [])], "b")
    sim = Simulator(toy_cluster(max_batch=1), episode(a, b))
    sim.run()
    ca, cb = sim.workflows[0].calls[0], sim.workflows[1].calls[0]
    assert cb.decode_start == ca.finish_t


def test_child_revealed_after_last_parent_plus_tool_latency():
    # diamond: 0 -> {1, 2} -> 3 with tool latencies on each edge target
    wf = make_workflow([(500, 20, 0.0, []), (400, 30, 0.5, [0]), (300, 5, 0.25, [0]),
                        (200, 10, 0.75, [1, 2])])
    sim = Simulator(toy_cluster(prefill=(LM, LM), decode=(LM, LM)), episode(wf))
    sim.run()
    c = sim.workflows[0].calls
    assert c[1].reveal_t == pytest.approx(c[0].finish_t + 0.5, abs=1e-12)
    assert c[2].reveal_t == pytest.approx(c[0].finish_t + 0.25, abs=1e-12)
    last_parent = max(c[1].finish_t, c[2].finish_t)
    assert c[3].reveal_t == pytest.approx(last_parent + 0.75, abs=1e-12)
    # an idle cluster starts a revealed call at once
    assert c[3].prefill_start == c[3].reveal_t
    assert all(x.state == CallState.DONE for x in c)


def test_fallback_places_on_the_faster_pair():
    slow, fast = ToyLatency(b=4e-4), ToyLatency(b=1e-4, c=0.005)
    wf = make_workflow([(2000, 50, 0.0, [])])
    sim = Simulator(toy_cluster(prefill=(slow, fast), decode=(slow, fast)), episode(wf))
    sim.run()
    call = sim.workflows[0].calls[0]
    assert (call.prefill_inst, call.decode_inst) == (1, 1)


def test_decode_placement_avoids_an_instance_that_cannot_hold_the_call():
    fast, slow = ToyLatency(c=0.001), ToyLatency(c=0.05)
    wf = make_workflow([(3000, 100, 0.0, [])])
    sim = Simulator(toy_cluster(decode=(fast, slow), capacity=(2000, 10_000)), episode(wf))
    sim.run()
    assert sim.workflows[0].calls[0].decode_inst == 1


def test_kv_demand_above_every_decode_capacity_is_an_error():
    from hexagent_gym.workload.workload import TraceError

    wf = make_workflow([(3000, 100, 0.0, [])])
    with pytest.raises(TraceError, match="KV capacity of 2000"):
        Simulator(toy_cluster(capacity=2000), episode(wf))


def test_invalid_options_are_rejected():
    wf = make_workflow([(10, 1, 0.0, [])])
    with pytest.raises(ValueError, match="estimation_error"):
        Simulator(toy_cluster(), episode(wf), estimation_error=1.5)
    with pytest.raises(ValueError, match="planning_latency"):
        Simulator(toy_cluster(), episode(wf), planning_latency=-1)
    with pytest.raises(ValueError, match="max_calls_per_decision"):
        Simulator(toy_cluster(), episode(wf), max_calls_per_decision=0)
    with pytest.raises(ValueError, match="rng"):
        Simulator(toy_cluster(), episode(wf), estimation_error=0.1)


def test_scheduler_loads_are_the_instances_committed_work_at_every_decision():
    """The flat load lists that Ŝ snapshots copy hold what the instances have committed: at
    every decision of an episode with queues, moves and a binding decode memory, the counts
    equal the calls placed and not finished, the token sums equal theirs (up to the rounding
    of adding and removing in another order), and the instances' properties read the lists."""
    from tests.toy import tight_memory_simulator

    sim = tight_memory_simulator()
    loads = sim.loads
    dp = sim.run_until_decision()
    checked = 0
    while dp is not None:
        live = [c for w in sim.workflows for c in w.calls
                if c.decode_inst >= 0 and c.state != CallState.DONE]
        for d, inst in enumerate(sim.decode):
            mine = [c for c in live if c.decode_inst == d]
            assert loads.dec_count[d] == inst.committed_count == len(mine)
            assert loads.dec_pred[d] == pytest.approx(sum(c.kv_pred for c in mine), abs=1e-6)
            assert inst.committed_pred is loads.dec_pred[d]
        for p, inst in enumerate(sim.prefill):
            queued = [c for c in inst.queue]
            tokens = sum(c.l_in for c in queued) + (inst.running.l_in if inst.running else 0)
            assert loads.pf_tokens[p] == inst.load_tokens == pytest.approx(tokens)
            assert (inst.run_end == -float("inf")) == (inst.running is None)
        checked += 1
        while not dp.done:
            slot = dp.picked.index(False)
            dp.pick(slot, *dp.best_pair(slot)[:2])
        dp = sim.run_until_decision()
    assert checked > 10 and sim.moves > 0


def test_a_standalone_decode_instance_keeps_its_own_loads():
    from types import SimpleNamespace

    from hexagent_gym.planning.entities import DecodeInstance

    inst = DecodeInstance(3, "g", ToyLatency(), 1000, 4)
    call = SimpleNamespace(kv_pred=300, ctx_share=150.0)
    inst.reserve(call)
    inst.reserve(call)
    inst.release(call)
    assert (inst.committed_pred, inst.committed_count, inst.sched_ctx) == (300.0, 1, 150.0)
    assert inst.loads.dec_count == [0, 0, 0, 1]


@pytest.mark.parametrize("error", [0.0, 0.3])
def test_call_estimates_are_the_standalone_rule_of_their_own_inputs(error):
    # the engine takes error-free estimates from ClusterTables.alone_estimate's cache; every
    # call's est_duration (on reveal) and ef (on completion) must be the uncached rule's floats
    from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
    config = EpisodeConfig(cluster="hetero-1", trace="mixed", num_workflows=30, load=1.5,
                           seed=5, estimation_error=error)
    sim = EpisodeFactory(config).simulator()
    sim.run()
    tables = sim.tables
    checked = 0
    for wf in sim.workflows:
        for c in wf.calls:
            alone = c.pf_true if c.pf_err == 1.0 else [x * c.pf_err for x in c.pf_true]
            if c.lead is None:
                assert c.est_duration == tables.standalone_estimate(
                    alone, c.l_in, c.l_out_pred, c.dec_err)
                own = c.spec.own_hit
                assert list(c.pf_true) == list(tables.alone_prefill(c.l_in, own))
            assert c.ef == c.ef_start + tables.standalone_estimate(c.pf_true, c.l_in, c.l_out,
                                                                   1.0)
            checked += 1
    assert checked > 60


def test_the_standalone_estimate_cache_stays_bounded(monkeypatch):
    import hexagent_gym.planning.cluster_tables as ct
    from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
    monkeypatch.setattr(ct, "_ALONE_CACHE_SIZE", 4)
    sim = EpisodeFactory(EpisodeConfig(cluster="hetero-1", trace="bfcl_v3", num_workflows=20,
                                       load=1.0, seed=1)).simulator()
    sim.run()
    tables = sim.tables
    assert 0 < len(tables._alone_cache) <= 4
    for c in sim.workflows[0].calls:  # still the rule's floats after the clears
        assert c.est_duration == tables.standalone_estimate(c.pf_true, c.l_in, c.l_out_pred,
                                                            1.0)


def test_episodes_of_one_factory_check_each_workflow_spec_once(monkeypatch):
    import hexagent_gym.sim.engine as engine_module
    from hexagent_gym.episode import EpisodeConfig, EpisodeFactory

    seen = []
    real = engine_module.check_kv_demand
    monkeypatch.setattr(engine_module, "check_kv_demand",
                        lambda flows, *a, **k: (seen.append(list(flows)), real(flows, *a, **k)))
    factory = EpisodeFactory(EpisodeConfig(cluster="hetero-1", trace="bfcl_v3",
                                           num_workflows=40, load=1.0, seed=0))
    first = factory.simulator(1)
    factory.simulator(1)  # the same workflows: nothing left to check
    factory.simulator(2)
    assert seen[0] == list(first.workload.workflows) and seen[1] == []
    assert 0 < len(seen[2]) <= 40 and not {id(w) for w in seen[2]} & {id(w) for w in seen[0]}


def test_run_pauses_the_collector_for_the_episode_and_restores_it():
    """Engine.run turns Python's garbage collector off while the episode runs and back on
    after it (also when a pick raises); left as it was when it was off, or with
    pause_gc=False."""
    import gc

    from hexagent_gym.planning.decisions import earliest_finish_pick
    from tests.toy import tight_memory_simulator

    seen = []

    def watching(dp):
        seen.append(gc.isenabled())
        return earliest_finish_pick(dp)

    assert gc.isenabled()
    tight_memory_simulator().run(watching)
    assert seen and not any(seen) and gc.isenabled()
    seen.clear()
    tight_memory_simulator().run(watching, pause_gc=False)
    assert all(seen) and gc.isenabled()

    def failing(dp):
        raise RuntimeError("policy failed")

    with pytest.raises(RuntimeError, match="policy failed"):
        tight_memory_simulator().run(failing)
    assert gc.isenabled()
    gc.disable()
    try:
        seen.clear()
        tight_memory_simulator().run(watching)
        assert seen and not any(seen) and not gc.isenabled()  # off before: stays off
    finally:
        gc.enable()


def _episodes_for_close():
    from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
    from tests.toy import tight_memory_simulator

    yield "preemptions", tight_memory_simulator
    for name, config in (
            ("groups, errors", dict(cluster="hetero-1", trace="lats", num_workflows=8, seed=1,
                                    estimation_error=0.3, load=1.5)),
            ("timeline", dict(cluster="hetero-1", trace="bfcl_v3", num_workflows=30, seed=0,
                              record_timeline=True))):
        factory = EpisodeFactory(EpisodeConfig(**config))
        factory.fill_horizons()  # their standalone runs happen once per trace, not per episode
        yield name, factory.simulator


@pytest.mark.parametrize("name,build", list(_episodes_for_close()),
                         ids=[n for n, _ in _episodes_for_close()])
def test_close_frees_the_episode_by_reference_counting(name, build):
    """run(close=True) returns the same result, then leaves the collector nothing to find: the
    episode went by reference counting (without close, its cycles wait for a collection). A
    closed simulator is empty, its calls unlinked, and running it again raises."""
    import gc

    def garbage_after(close):
        gc.collect()
        gc.disable()
        try:
            sim = build()
            calls = len(sim.workload.workflows)
            result = sim.run(close=close)
            if close:
                assert sim.workflows == [] and sim.finished == []
                with pytest.raises(RuntimeError, match="closed"):
                    sim.run_until_decision()
                sim.close()  # idempotent
            del sim
            return result, calls, gc.collect()
        finally:
            gc.enable()

    kept, calls, left = garbage_after(False)
    closed, _, none = garbage_after(True)
    assert left > calls and none == 0
    assert closed.ratios.tolist() == kept.ratios.tolist() and closed.records == kept.records
    assert (closed.timeline is None) == (kept.timeline is None)
    if kept.timeline is not None:
        assert closed.timeline.to_chrome_trace() == kept.timeline.to_chrome_trace()


def test_close_unlinks_the_calls_a_caller_kept():
    """What close documents: calls held elsewhere survive it, without their workflow."""
    from tests.toy import tight_memory_simulator

    sim = tight_memory_simulator()
    sim.run()
    kept = [c for w in sim.workflows for c in w.calls]
    sim.close()
    assert kept and all(c.workflow is None for c in kept)
    assert all(c.state == CallState.DONE for c in kept)
