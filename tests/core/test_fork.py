"""Forks of a running simulator continue exactly like the original, and never touch it."""

from __future__ import annotations

import pytest

from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.planning.decisions import earliest_finish_pick
from hexagent_gym.sim.fork import ForkShare, fork, known_only, pending_decision, revealed_only

CASES = {
    "groups": dict(cluster="hetero-1", trace="lats", num_workflows=30, load=1.0),
    "errors": dict(cluster="hetero-2", trace="mixed", num_workflows=30, load=1.2,
                   estimation_error=0.2),
    "kv-pressure": dict(cluster="hetero-1-lowmem", trace="agent_sessions", num_workflows=20,
                        load=1.0),
    "async-plans": dict(cluster="hetero-1", trace="bfcl_v3", num_workflows=30, load=1.0,
                        planning_latency=0.01),
    # prefix caches that evict: a fork's cache operations must reach its own LRU order only
    "small-caches": dict(cluster="hetero-1", trace="bfcl_v3", num_workflows=30, load=1.0,
                         prefix_cache_tokens=4096),
}


def simulator(case: str):
    return EpisodeFactory(EpisodeConfig(**CASES[case], seed=5)).simulator()


def fingerprint(sim) -> tuple:
    """Every workflow's arrival, finish and horizon, every call's placement and times, and the
    counters: equal fingerprints mean the same episode event for event."""
    flows = [(w.arrival, w.finish_t, w.horizon) for w in sim.workflows]
    calls = [(c.prefill_inst, c.decode_inst, c.prefill_start, c.prefill_end, c.transfer_end,
              c.decode_start, c.finish_t, c.hit) for w in sim.workflows for c in w.calls]
    return (flows, calls, sim.now, sim.num_calls, sim.invocations, sim.decisions_made, sim.moves,
            sim.preemptions, sim.cached_tokens, len(sim.finished))


def finish(sim, dp, pick=earliest_finish_pick) -> None:
    while dp is not None:
        while not dp.done:
            dp.pick(*pick(dp))
        dp = sim.run_until_decision()


def last_slot_pick(dp):
    """A different policy: the last unpicked call at its earliest-finish pair."""
    slot = dp.remaining[-1]
    p, d, _ = dp.best_pair(slot)
    return slot, p, d


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("at", [1, 25, 90])
def test_fork_continues_exactly_and_leaves_the_original_alone(case, at):
    ref = simulator(case)
    finish(ref, ref.run_until_decision())
    expected = fingerprint(ref)

    sim = simulator(case)
    dp = sim.run_until_decision()
    for _ in range(at):  # advance to the at-th decision point (or the last one)
        while not dp.done:
            dp.pick(*earliest_finish_pick(dp))
        nxt = sim.run_until_decision()
        if nxt is None:
            pytest.skip("episode shorter than the fork point")
        dp = nxt
    if len(dp.remaining) > 1:  # fork mid-decision, with a pick already in Ŝ
        dp.pick(*earliest_finish_pick(dp))
    (copy,) = fork(sim)
    copy_dp = pending_decision(copy)
    assert copy_dp is not dp and copy_dp.picked == dp.picked and copy_dp.now == dp.now

    # drive the fork with another policy first: nothing may leak into the original
    (other,) = fork(sim)
    finish(other, pending_decision(other), last_slot_pick)
    finish(sim, dp)
    assert fingerprint(sim) == expected
    finish(copy, copy_dp)
    assert fingerprint(copy) == expected
    assert sim.result().ratios.tolist() == copy.result().ratios.tolist() \
        == ref.result().ratios.tolist()


def test_fork_shares_read_only_inputs_and_copies_state():
    sim = simulator("groups")
    dp = sim.run_until_decision()
    (copy,) = fork(sim)
    assert copy.tables is sim.tables and copy.workload is sim.workload
    assert copy.horizons is sim.horizons and copy.cluster is sim.cluster
    assert copy.workflows[0].spec is sim.workflows[0].spec
    assert copy.workflows[0] is not sim.workflows[0] and copy.events is not sim.events
    assert copy.caches is not sim.caches
    assert pending_decision(copy).state is not dp.state
    # the event counters continue from the same value in both
    sim.events.push(99.0, 0, None)
    copy.events.push(99.0, 0, None)
    assert max(e[2] for e in sim.events.heap) == max(e[2] for e in copy.events.heap)


def _state(obj) -> tuple:
    """Every slot of ``obj``: plain values as they are, lists item by item, other objects by
    identity (a shared finished workflow must keep pointing at the same things)."""
    def value(v):
        if isinstance(v, list):
            return tuple(value(x) for x in v)
        if v is None or isinstance(v, (bool, int, float, str, tuple)):
            return v
        return ("id", id(v))
    slots = [name for cls in type(obj).__mro__ for name in getattr(cls, "__slots__", ())]
    return tuple((name, value(getattr(obj, name, None))) for name in slots)


def _finished_state(sim) -> list[tuple]:
    return [(_state(w), [_state(c) for c in w.calls]) for w in sim.finished]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("cut", [None, known_only, revealed_only])
def test_forks_share_finished_workflows_and_never_write_them(case, cut):
    sim = simulator(case)
    dp = sim.run_until_decision()
    share = ForkShare(sim)
    while not 5 <= len(sim.finished) < len(sim.workflows):  # some finished, some live
        while not dp.done:
            dp.pick(*earliest_finish_pick(dp))
        dp = sim.run_until_decision()
        assert dp is not None, "the episode ended before the fork point"
    before = _finished_state(sim)
    live = [w for w in sim.workflows if w.finish_t < 0]
    assert before and live
    (copy,) = fork(sim, shared=share)
    shared = {id(w) for w in copy.workflows} & {id(w) for w in sim.workflows}
    assert shared == {id(w) for w in sim.finished}  # finished: shared; live: copied
    assert copy.finished == sim.finished and copy.finished is not sim.finished
    if cut is not None:
        cut(copy)
    finish(copy, pending_decision(copy), last_slot_pick)
    assert copy.done
    assert _finished_state(sim) == before
    # a later fork through the same share also shares what finished since, and continues
    # exactly like the original
    count = len(sim.finished)
    while len(sim.finished) == count:
        while not dp.done:
            dp.pick(*earliest_finish_pick(dp))
        dp = sim.run_until_decision()
        assert dp is not None, "the episode ended before a later fork point"
    (later,) = fork(sim, shared=share)
    shared = {id(w) for w in later.workflows} & {id(w) for w in sim.workflows}
    assert shared == {id(w) for w in sim.finished} and len(shared) > count
    finish(later, pending_decision(later))
    finish(sim, dp)
    assert fingerprint(later) == fingerprint(sim)
    assert _finished_state(sim)[:len(before)] == before


def test_fork_share_belongs_to_one_simulator():
    sim, other = simulator("groups"), simulator("groups")
    sim.run_until_decision()
    other.run_until_decision()
    with pytest.raises(ValueError, match="another simulator"):
        fork(other, shared=ForkShare(sim))
