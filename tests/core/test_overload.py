"""Overloaded episodes at a cost per call independent of the queue (docs/overload.md).

Holds: the prefill queue's heap gives the head a scan would (any keys, ties, re-keys and
removals); ``plan_depth`` at or above the queue's length decides exactly as the exact rule on a
loaded episode; a binding ``plan_depth`` keeps every invocation's window bounded, keeps the
loads' queued sums equal to what the queues hold, and finishes the episode; a one-pass
ordering's picks in one loop (``DecisionPoint.pick_in_order``, compiled or not) and HexAgent's
scalar one-pass order equal the pick-by-pick answers and numpy's order; the overload
benchmark's rows and its policy list.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from hexagent_gym.episode import ConfigError, EpisodeConfig, EpisodeFactory
from hexagent_gym.experiments.overload_bench import (
    FLAT_GOAL,
    bench_overload,
    flat_ratio,
    over_goal,
)
from hexagent_gym.planning import kernels
from hexagent_gym.planning.decisions import DecisionPoint, Stage
from hexagent_gym.planning.entities import PLANNED, UNPLANNED, CallState, head_index
from hexagent_gym.planning.prefill_queue import PrefillQueue
from hexagent_gym.policy import make_policy, run_policy

LOADED = dict(cluster="hetero-1", trace="bfcl_v3", num_workflows=120, arrival_rate=40.0,
              load=None, seed=1)


class _Call:
    __slots__ = ("uid", "queue_key")

    def __init__(self, uid: int, key: int) -> None:
        self.uid = uid
        self.queue_key = key


@pytest.mark.parametrize("seed", range(5))
def test_prefill_queue_heads_as_a_scan(seed):
    rng = np.random.default_rng(seed)
    queue, mirror, uid = PrefillQueue(), [], 0
    for _ in range(3000):
        op = rng.integers(0, 4)
        if op == 0 or not mirror:  # insert, keys drawn from a small range: many ties
            call = _Call(uid, int(rng.choice([PLANNED, UNPLANNED])) + int(rng.integers(0, 8)))
            uid += 1
            queue.append(call)
            mirror.append(call)
        elif op == 1:  # re-key a queued call (as a plan does)
            call = mirror[int(rng.integers(len(mirror)))]
            call.queue_key = int(rng.choice([PLANNED, UNPLANNED])) + int(rng.integers(0, 8))
            queue.rekey(call)
        elif op == 2:  # remove one (a re-placement), maybe put it back at the end
            call = mirror.pop(int(rng.integers(len(mirror))))
            queue.remove(call)
            if rng.random() < 0.5:
                queue.append(call)
                mirror.append(call)
        else:
            assert queue.pop_next() is mirror.pop(head_index(mirror))
        assert len(queue) == len(mirror) and list(queue) == mirror


def _episode_hash(policy: str, **options) -> str:
    sim = EpisodeFactory(EpisodeConfig(**LOADED, **options)).simulator()
    result = run_policy(sim, make_policy(policy))
    calls = [(c.prefill_inst, c.decode_inst, c.prefill_start, c.decode_start, c.finish_t)
             for w in sim.workflows for c in w.calls]
    return hashlib.sha256(repr((calls, result.decisions, result.invocations, sim.moves,
                                sim.preemptions)).encode()).hexdigest()


@pytest.mark.parametrize("policy", ["fcfs", "hexagent", "atlas", "sglang-router"])
def test_a_depth_that_never_binds_decides_as_the_exact_rule(policy):
    assert _episode_hash(policy, plan_depth=100_000) == _episode_hash(policy)


@pytest.mark.parametrize("policy", ["fcfs", "hexagent", "llf", "random"])
def test_a_binding_depth_bounds_the_window_and_keeps_the_loads(policy):
    depth = 6
    sim = EpisodeFactory(EpisodeConfig(**LOADED, plan_depth=depth)).simulator()
    pol = make_policy(policy)
    pol.reset(sim)
    loads, longest, truncated = sim.loads, 0, 0
    dp = sim.run_until_decision()
    while dp is not None:
        waiting = sim.num_waiting(dp.stage)
        fresh = sum(c.prefill_inst < 0 for c in dp.calls)
        assert len(dp.calls) <= max(depth, min(waiting, depth + fresh))
        truncated += waiting > len(dp.calls)
        longest = max(longest, waiting)
        for d, inst in enumerate(sim.decode):
            queued = list(inst.queued.values())
            assert all(c.state == CallState.WAITING_PREFILL for c in queued)
            assert loads.dec_qcount[d] == len(queued)
            assert loads.dec_qpred[d] == sum(c.kv_pred for c in queued)
            assert loads.dec_qctx[d] == sum(c.ctx_share for c in queued)
        for p, inst in enumerate(sim.prefill):
            assert loads.pf_qtokens[p] == sum(c.l_in for c in inst.queue)
        while not dp.done:
            dp.pick(*pol.pick(dp))
        dp = sim.run_until_decision()
    assert sim.done and truncated > 10 and longest > 3 * depth


def test_plan_depth_is_checked():
    with pytest.raises(ConfigError, match="plan_depth"):
        EpisodeConfig(plan_depth=0)
    with pytest.raises(ConfigError, match="not both"):
        EpisodeConfig(plan_depth=8, max_calls_per_decision=8)


def test_overload_bench_rows():
    rows = bench_overload(["fcfs", "hexagent"], sizes=(20, 40), plan_depth=4)
    assert [(r.policy, r.num_workflows) for r in rows] == [
        ("fcfs", 20), ("hexagent", 20), ("fcfs", 40), ("hexagent", 40)]
    assert all(r.num_calls > 0 and r.seconds > 0 and r.picks_per_call > 0 for r in rows)
    assert flat_ratio(rows, "fcfs") > 0
    assert over_goal(rows, goal=0.0) == [(p, flat_ratio(rows, p)) for p in ("fcfs", "hexagent")]
    assert over_goal(rows[:2], goal=0.0) == []  # one episode length: no ratio
    assert FLAT_GOAL == 1.5


def _fresh(dp: DecisionPoint) -> DecisionPoint:
    """A decision over the same window and a copy of its Ŝ, nothing picked or cached."""
    return DecisionPoint(dp.stage, dp.now, dp.calls, dp.state.copy())


def _state(dp: DecisionPoint) -> tuple:
    s = dp.state
    return (s.free_l, s.pf_tokens_l, s.dec_tokens_l, s.dec_count_l, s.dec_ctx_l, s._pick_log,
            s.limits())


@pytest.mark.parametrize(("cluster", "num_workflows", "rate", "compiled"), [
    ("hetero-1-x2", 100, 1000.0, True), ("hetero-1-x2", 100, 1000.0, False),
    ("hetero-1-lowmem", 60, 400.0, True)])
def test_picks_in_order_equal_picks_one_by_one(cluster, num_workflows, rate, compiled):
    # long prefill windows (a burst, every waiting call planned) on clusters with several
    # members per class, prefix-cache hits and little decode memory: a one-pass order
    # (HexAgent's) picked in one loop gives the same plan, Δs and Ŝ as best_pair + pick per
    # slot; HexAgent's scalar order is numpy's stable argsort of -risk
    if compiled and not kernels.AVAILABLE:
        pytest.skip("the compiled kernels are not built")
    from hexagent_gym.agents.hexagent import projected_risk  # a higher layer: only here

    was = kernels.best_prefill_pairs is not None
    kernels.use_compiled(compiled)
    try:
        sim = EpisodeFactory(EpisodeConfig(cluster=cluster, trace="bfcl_v3",
                                           num_workflows=num_workflows, arrival_rate=rate,
                                           load=None, seed=3)).simulator()
        pol = make_policy("hexagent")
        pol.reset(sim)
        long = 0
        dp = sim.run_until_decision()
        while dp is not None:
            if dp.stage == Stage.PREFILL and len(dp.calls) > 16:
                long += 1
                order = pol._one_pass_order(_fresh(dp))
                risk = projected_risk(_fresh(dp))
                assert order == np.argsort(-risk, kind="stable").tolist()
                one, loop = _fresh(dp), _fresh(dp)
                one.pick(order[0], *one.best_pair(order[0])[:2])  # as decide's first pick
                loop.pick(order[0], *loop.best_pair(order[0])[:2])
                for slot in order[1:]:
                    one.pick(slot, *one.best_pair(slot)[:2])
                assert loop.pick_in_order(order[1:]) == len(order) - 1 and loop.done
                assert [(c.uid, p, d, x) for c, p, d, x in loop.plan] == [
                    (c.uid, p, d, x) for c, p, d, x in one.plan]
                assert _state(loop) == _state(one)
                assert loop.pick_in_order(order) == 0  # stops at a picked slot
            pol.decide(dp)
            while not dp.done:
                dp.pick(*pol.pick(dp))
            dp = sim.run_until_decision()
        assert long > 20
    finally:
        kernels.use_compiled(was)


def test_re_placing_a_queued_call_keeps_the_loads_of_unplace_then_enqueue():
    # PlanFlow._replace fuses _unplace and _enqueue_prefill: the same loads, bit for bit
    sims = [EpisodeFactory(EpisodeConfig(**LOADED, plan_depth=8)).simulator() for _ in "ab"]
    for sim in sims:
        run_policy_until(sim, 400)
    a, b = sims
    moved = 0
    for ca, cb in zip(a._waiting_prefill.values(), b._waiting_prefill.values(), strict=True):
        if ca.prefill_inst < 0:
            continue
        p = (ca.prefill_inst + 1) % len(a.prefill)
        d = (ca.decode_inst + 1) % len(a.decode)
        a._unplace(ca)
        a._enqueue_prefill(ca, p, d)
        b._replace(cb, p, d)
        moved += 1
    assert moved > 10
    la, lb = a.loads, b.loads
    for name in ("pf_tokens", "pf_queued", "pf_qtokens", "dec_pred", "dec_count", "dec_ctx",
                 "dec_qpred", "dec_qcount", "dec_qctx"):
        assert getattr(la, name) == getattr(lb, name), name
    assert [[c.uid for c in q.queue] for q in a.prefill] == [
        [c.uid for c in q.queue] for q in b.prefill]
    assert [sorted(i.queued) for i in a.decode] == [sorted(i.queued) for i in b.decode]


def run_policy_until(sim, invocations: int) -> None:
    """Run hexagent on ``sim`` for ``invocations`` decisions (the queues are long by then)."""
    pol = make_policy("hexagent")
    pol.reset(sim)
    for _ in range(invocations):
        dp = sim.run_until_decision()
        pol.decide(dp)
        while not dp.done:
            dp.pick(*pol.pick(dp))
