"""The decision seam's fast answers equal the full Δ tensor's, bit for bit.

``DecisionPoint.min_delta`` and ``best_pair`` never build the (n, P, D) tensor: they reduce over
prefill classes, take scalar paths for one-call windows and expand only tied decode instances;
``delta`` itself is built without the window's arrays for small decode-stage windows and for
one call left at the prefill stage. Here every pick of real episodes (heterogeneous clusters with
several members per class, queues, prefix-cache hits, binding decode limits, free decode moves)
is checked against ``np.argmin`` and ``min`` over the full tensor, computed independently from
the same Ŝ.
"""

from __future__ import annotations

import numpy as np
import pytest

from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.planning.decisions import Stage
from tests.toy import tight_memory_simulator


def full_delta(dp) -> np.ndarray:
    """The full Δ tensor from Ŝ, without touching the decision's caches."""
    state = dp.state
    delta = (state.project_prefill(dp.batch) if dp.stage == Stage.PREFILL
             else state.project_decode(dp.batch))
    delta[np.asarray(dp.picked)] = np.inf
    return delta


def argmin_pair(row: np.ndarray) -> tuple[int, int, float]:
    flat = int(np.argmin(row))
    p, d = divmod(flat, row.shape[1])
    return p, d, float(row.flat[flat])


def check_episode(sim, seed: int) -> dict[str, int]:
    rng = np.random.default_rng(seed)
    seen = {"one": 0, "window": 0, "long": 0, "ties": 0, "decode": 0, "movable": 0,
            "decode_rows": 0, "prefill_row": 0}
    dp = sim.run_until_decision()
    while dp is not None:
        while not dp.done:
            ref = full_delta(dp)
            live = [i for i in range(len(dp.calls)) if not dp.picked[i]]
            first = int(rng.choice(live))
            # before anything is cached: the scalar (one call), window or one-row path
            assert dp.best_pair(first) == argmin_pair(ref[first])
            assert np.array_equal(dp.delta_row(first), ref[first])
            best = ref.reshape(len(dp.calls), -1).min(axis=1)
            assert np.array_equal(dp.min_delta, best)
            for i in live:  # from the cached class projection
                assert dp.best_pair(i) == argmin_pair(ref[i])
                row = ref[i]
                seen["ties"] += int(np.count_nonzero(row == row.min()) > 1 and row.min() < np.inf)
            if rng.random() < 0.5:  # the tensor itself (built without the CallBatch for small
                # decode windows and one-call prefill rows); on the other half of the picks the
                # pick below prices its entry without it
                seen["decode_rows"] += dp.stage == Stage.DECODE and dp._scalar_window()
                seen["prefill_row"] += dp.stage == Stage.PREFILL and dp.num_remaining == 1
                assert np.array_equal(dp.delta, ref)
            n = len(dp.calls)
            seen["one" if n == 1 else "window" if n <= 16 else "long"] += 1
            if dp.stage == Stage.DECODE:
                seen["decode"] += 1
                seen["movable"] += int(np.isfinite(ref).sum(axis=(1, 2)).max() > 1)
            # pick a random valid pair (not always the best) so the states vary; decode calls go
            # to their best pair (random moves would bounce calls between instances for long)
            slot = int(rng.choice(live))
            if dp.stage == Stage.PREFILL and rng.random() < 0.5:
                valid = np.argwhere(np.isfinite(ref[slot]))
                p, d = (int(x) for x in valid[rng.integers(len(valid))])
            else:
                p, d, _ = argmin_pair(ref[slot])
            dp.pick(slot, p, d)
            assert dp.plan[-1][3] == ref[slot, p, d]  # the committed Δ is the tensor's entry
        dp = sim.run_until_decision()
    return seen


@pytest.mark.parametrize("config", [
    EpisodeConfig(cluster="hetero-1-x2", trace="bfcl_v3", num_workflows=40, load=2.0, seed=1),
    EpisodeConfig(cluster="hetero-1-x2", trace="lats", num_workflows=6, load=2.0, seed=2),
    EpisodeConfig(cluster="hetero-1-lowmem", trace="agent_sessions", num_workflows=12, load=3.0,
                  seed=3, estimation_error=0.3),
    EpisodeConfig(cluster="hetero-1", trace="bfcl_v3", num_workflows=50, arrival_rate=500.0,
                  seed=5),
    EpisodeConfig(cluster="hetero-2", trace="mixed", num_workflows=30, load=1.5, seed=4,
                  prefix_cache=False, free_decode_calls=False, length_predictor="oracle"),
], ids=["bfcl-x2", "lats-x2", "lowmem-moves", "burst", "hetero2-nocache"])
def test_fast_answers_equal_the_full_tensor(config):
    seen = check_episode(EpisodeFactory(config).simulator(), seed=config.seed)
    assert seen["one"] > 0 and seen["decode"] > 0 and seen["ties"] > 0
    assert seen["decode_rows"] > 0 and seen["prefill_row"] > 0
    if config.arrival_rate:  # the burst fills long windows
        assert seen["window"] > 0 and seen["long"] > 0


def test_fast_answers_equal_the_full_tensor_when_decode_memory_binds():
    # three twin instances per pool with little KV: reservations bind, free calls may move,
    # and twins tie exactly
    seen = check_episode(tight_memory_simulator(), seed=7)
    assert seen["movable"] > 0 and seen["window"] > 0 and seen["ties"] > 0
    assert seen["decode_rows"] > 0 and seen["prefill_row"] > 0


@pytest.mark.parametrize("wait", [0.0, 0.02, 0.2, 100.0])
def test_best_prefill_pair_when_the_minimum_spans_prefill_classes(wait):
    # A decode start ``wait`` seconds away dominates the KV arrival of more and more prefill
    # instances, until every instance of every class ties: best_prefill_pair expands each class
    # reaching the minimum and must still return np.argmin's pair of the full row.
    sim = EpisodeFactory(EpisodeConfig(cluster="hetero-1-x2", trace="bfcl_v3", num_workflows=40,
                                       load=2.0, seed=1)).simulator()
    dp = sim.run_until_decision()
    state, batch = dp.state, dp.batch
    assert dp.stage == Stage.PREFILL and len(set(sim.tables.pf_class.tolist())) > 1
    state.decode_starts = lambda kv: np.full((len(kv), state.tables.num_decode), state.now + wait)
    classes = state.project_prefill_classes(batch)
    full = state.project_prefill(batch)
    spans = 0
    for i in range(len(dp.calls)):
        assert state.best_prefill_pair(batch, i, classes[i]) == argmin_pair(full[i])
        tied = np.argwhere(full[i] == full[i].min())
        spans += len(set(sim.tables.pf_class[tied[:, 0]].tolist())) > 1
    assert (spans > 0) == (wait == 100.0)


def test_decode_end_equals_decode_terms_end():
    # decode_terms inlines decode_end's arithmetic (the fallback's hot loop): both must give the
    # same float for every decode instance, batch size and context
    from hexagent_gym.cluster.cluster import load_cluster
    from hexagent_gym.planning.cluster_tables import ClusterTables
    from hexagent_gym.planning.placement import decode_end, decode_terms

    tables = ClusterTables(load_cluster("hetero-1"))
    rng = np.random.default_rng(0)
    num_d = tables.num_decode
    never = lambda d, need, over: pytest.fail("no limit binds here")  # noqa: E731
    checked = 0
    for _ in range(200):
        count = rng.integers(0, tables.batch_top + 3, num_d).tolist()
        ctx = rng.uniform(0.0, 2e5, num_d).tolist()
        tokens = [0.0] * num_d
        weight, own_ctx, now = rng.uniform(1, 500), rng.uniform(0, 9e3), rng.uniform(0, 100)
        for d in range(num_d):
            if count[d] >= tables.dec_static[d][1]:
                continue  # a full batch takes the slow start: not this test's concern
            start, end = decode_terms(tables, d, now, tokens, count, ctx, weight, own_ctx, 0.0,
                                      never)
            assert start == now
            assert end == decode_end(tables, d, now, count, ctx, weight, own_ctx)
            checked += 1
    assert checked > 1000


@pytest.mark.parametrize("policy", ["fcfs", "llf", "atlas", "sglang-router"])
def test_scalar_entry_of_a_pick_elsewhere_equals_the_numpy_projection(policy):
    """A pick away from the best pair takes its Δ from the scalar one-entry rules; at every pick
    of baselines that place elsewhere it must equal numpy's entry (prefill and decode stage)."""
    from hexagent_gym.policy import make_policy

    sim = EpisodeFactory(EpisodeConfig(cluster="hetero-1-lowmem", trace="mixed",
                                       num_workflows=40, load=2.0, seed=6)).simulator()
    pol = make_policy(policy)
    pol.reset(sim)
    compared = {Stage.PREFILL: 0, Stage.DECODE: 0}
    dp = sim.run_until_decision()
    while dp is not None:
        while not dp.done:
            slot, p, d = pol.pick(dp)
            one = dp.batch.row(slot)
            if dp.stage == Stage.PREFILL:
                ref = float(dp.state.project_prefill(one)[0, p, d])
            elif p != dp.calls[slot].prefill_inst:
                ref = np.inf
            else:
                ref = float(dp.state.project_decode_rows(one)[0, d])
            got = dp._delta_at(slot, p, d)
            assert got == ref or (np.isinf(got) and np.isinf(ref)), (got, ref)
            compared[dp.stage] += 1
            dp.pick(slot, p, d)
        dp = sim.run_until_decision()
    assert compared[Stage.PREFILL] > 50 and compared[Stage.DECODE] > 50
