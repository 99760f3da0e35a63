"""Property tests of instance faults (docs/faults.md) over random DAGs, random small clusters
and random fault schedules: every workflow finishes exactly once, no call is lost or completes
twice, phases stay ordered, and true KV on every decode instance stays within its capacity at
every decision point and at its peak; the seam never offers an unavailable instance."""

from __future__ import annotations

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

from hexagent_gym.planning.decisions import earliest_finish_pick
from hexagent_gym.sim.simulator import Simulator
from hexagent_gym.workload.arrivals import EpisodeWorkload
from hexagent_gym.workload.prompts import DEFAULT_BLOCK_TOKENS
from hexagent_gym.workload.workload import make_workflow
from tests.core.test_properties import check_completion, latencies, random_picker
from tests.toy import toy_cluster, workflow_with_reuse


@st.composite
def small_workflows(draw, max_calls=5):
    n = draw(st.integers(1, max_calls))
    calls = []
    for i in range(n):
        parents = sorted(draw(st.sets(st.integers(0, i - 1), max_size=min(i, 2)))) if i else []
        calls.append((draw(st.integers(1, 2000)), draw(st.integers(1, 120)),
                      draw(st.sampled_from([0.0, 0.1, 0.5])), parents))
    return make_workflow(calls, f"w{draw(st.integers(0, 10**6))}")


@st.composite
def fault_scenarios(draw):
    wfs = draw(st.lists(small_workflows(), min_size=1, max_size=4))
    if draw(st.booleans()):  # a sample group of three (LATS's n samples), ridden by its leader
        group = [(300, draw(st.integers(5, 80)), [], {"sample_group": "g"}) for _ in range(3)]
        wfs.append(workflow_with_reuse(group + [(200, 20, [0, 1, 2], {})], f"g{len(wfs)}",
                                       block=DEFAULT_BLOCK_TOKENS))
    P, D = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    cluster = toy_cluster(prefill=tuple(draw(st.lists(latencies, min_size=P, max_size=P))),
                          decode=tuple(draw(st.lists(latencies, min_size=D, max_size=D))),
                          capacity=draw(st.integers(3200, 8000)),
                          max_batch=draw(st.integers(3, 6)), prefill_kv=4096)
    gaps = draw(st.lists(st.floats(0.0, 1.0), min_size=len(wfs), max_size=len(wfs)))
    work = EpisodeWorkload(tuple(wfs), np.cumsum(gaps), np.arange(len(wfs)))
    events = []
    for _ in range(draw(st.integers(0, 5))):
        pool = draw(st.sampled_from(["prefill", "decode"]))
        kind = draw(st.sampled_from(["fail", "drain", "slow"]))
        ev = {"time": draw(st.floats(0.0, 4.0)), "kind": kind,
              "instance": f"{pool}:{draw(st.integers(0, (P if pool == 'prefill' else D) - 1))}",
              "duration": draw(st.floats(0.01, 3.0))}
        if kind == "slow":
            ev["factor"] = draw(st.sampled_from([0.25, 0.5, 0.9]))
        events.append(ev)
    faults = {"events": events}
    if draw(st.booleans()):
        faults.update(mtbf=draw(st.floats(0.5, 5.0)), mttr=draw(st.floats(0.05, 1.0)),
                      kinds=["fail", "drain", "slow"])
    return cluster, work, faults


def run_checked(sim, pick):
    """Run the episode, checking at every decision that KV is within capacity and that no
    unavailable instance is offered."""
    flow = sim._faults
    dp = sim.run_until_decision()
    while dp is not None:
        for inst in sim.decode:
            inst.advance(sim.now)
            assert inst.true_kv() <= inst.capacity + 1e-6
        if flow is not None:
            down_p = flow.down_p if dp.stage == 0 else set()
            for slot in dp.remaining:
                mask = dp.feasible(slot)
                assert not mask[sorted(down_p)].any()
                for d in flow.down_d:
                    if dp.stage == 0 or d != dp.calls[slot].decode_inst:
                        assert not mask[:, d].any()
        while not dp.done:
            dp.pick(*pick(dp))
        dp = sim.run_until_decision()
    return sim.result()


@settings(max_examples=60, deadline=None)
@given(fault_scenarios(), st.integers(0, 2**31), st.sampled_from(["fallback", "random", "off"]))
def test_every_call_completes_once_under_faults(scenario, seed, mode):
    cluster, work, faults = scenario
    sim = Simulator(cluster, work, decisions=mode != "off", faults=faults, fault_seed=seed,
                    length_predictor="lognormal", rng=np.random.default_rng(seed))
    if mode == "off":
        res = sim.run()
    else:
        pick = random_picker(seed) if mode == "random" else None
        res = run_checked(sim, pick or earliest_finish_pick)
    check_completion(sim, cluster)
    assert res.num_workflows == len(work.workflows)
    assert res.fault_reexecuted_calls >= 0 and res.fault_recomputed_tokens >= 0
    event("work lost and served again" if res.fault_reexecuted_calls else "no work lost")


@settings(max_examples=15, deadline=None)
@given(fault_scenarios(), st.integers(0, 2**31))
def test_same_seed_same_episode_under_faults(scenario, seed):
    cluster, work, faults = scenario

    def episode():
        sim = Simulator(cluster, work, faults=faults, fault_seed=seed)
        res = sim.run()
        return ([(c.prefill_inst, c.decode_inst, c.finish_t) for w in sim.workflows
                 for c in w.calls], res.to_dict(include_records=False))

    first, second = episode(), episode()
    assert first[0] == second[0]
    first[1].pop("wall_seconds"), second[1].pop("wall_seconds")
    for k in ("scheduler_seconds", "scheduler_ms_per_invocation", "scheduler_ms_median"):
        first[1].pop(k), second[1].pop(k)
    assert first[1] == second[1]
