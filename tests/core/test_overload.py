"""Overloaded episodes at a cost per call independent of the queue (docs/overload.md).

Holds: the prefill queue's heap gives the head a scan would (any keys, ties, re-keys and
removals); ``plan_depth`` at or above the queue's length decides exactly as the exact rule on a
loaded episode; a binding ``plan_depth`` keeps every invocation's window bounded, keeps the
loads' queued sums equal to what the queues hold, and finishes the episode; the overload
benchmark's rows.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from hexagent_gym.entities import PLANNED, UNPLANNED, CallState, head_index
from hexagent_gym.episode import ConfigError, EpisodeConfig, EpisodeFactory
from hexagent_gym.overload_bench import bench_overload, flat_ratio
from hexagent_gym.policy import make_policy, run_policy
from hexagent_gym.prefill_queue import PrefillQueue

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
