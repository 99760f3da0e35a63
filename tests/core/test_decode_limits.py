"""Ŝ's shortcut for "no decode limit binds" is exact and stays current pick by pick.

``PlanState.decode_starts`` returns ``now`` at once when the largest demand fits in the smallest
KV slack and no batch is full; the (smallest slack, any batch full) pair is built once per Ŝ and
updated by every commit. Checked against a from-scratch rebuild and against the full
computation, along real episodes whose decode memory binds and whose memory is plentiful.
"""

from __future__ import annotations

import numpy as np
import pytest

from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.planning.decisions import Stage
from hexagent_gym.sim.simulator import Simulator
from tests.toy import tight_memory_simulator


def _full_starts(state, kv):
    """decode_starts without the shortcut (it is skipped when a batch is reported full)."""
    saved = state._limits
    state._limits = (-np.inf, True)
    try:
        return state.decode_starts(kv)
    finally:
        state._limits = saved


def _burst() -> Simulator:
    return EpisodeFactory(EpisodeConfig(cluster="hetero-1", trace="bfcl_v3", num_workflows=40,
                                        arrival_rate=300.0, seed=1)).simulator()


@pytest.mark.parametrize("build, binds", [(tight_memory_simulator, True), (_burst, False)],
                         ids=["memory-binds", "plentiful"])
def test_shortcut_equals_the_full_computation(build, binds):
    sim = build()
    rng = np.random.default_rng(0)
    dp = sim.run_until_decision()
    fast = slow = 0
    while dp is not None:
        while not dp.done:
            state = dp.state
            kv = dp.batch.kv_pred
            got = state.decode_starts(kv)
            want = _full_starts(state, kv)
            if isinstance(got, float):
                fast += 1
                assert isinstance(want, float) and got == want == dp.now
            else:
                slow += 1
                assert np.array_equal(np.broadcast_to(want, got.shape), got)
            if state._limits is not None:  # the incremental pair equals a rebuild
                assert state._limits == state._decode_limits()
            slot = dp.picked.index(False)
            if dp.stage == Stage.PREFILL and rng.random() < 0.5:  # vary the states
                valid = np.argwhere(dp.feasible(slot))
                p, d = (int(x) for x in valid[rng.integers(len(valid))])
            else:
                p, d, _ = dp.best_pair(slot)
            dp.pick(slot, p, d)
        dp = sim.run_until_decision()
    assert fast > 0
    assert (slow > 0) == binds


@pytest.mark.parametrize("build", [tight_memory_simulator, _burst],
                         ids=["memory-binds", "plentiful"])
def test_one_entrys_decode_terms_need_no_limits(build):
    """One call's (start, end) on one decode instance, computed without Ŝ's limits
    (``_decode_terms_at``), equals the limits' shortcut (start now, :func:`decode_end`) wherever
    that applies and :func:`decode_terms` elsewhere: on every instance, before every pick."""
    from hexagent_gym.planning.placement import decode_end, decode_terms

    sim = build()
    dp = sim.run_until_decision()
    shortcut = full = 0
    while dp is not None:
        while not dp.done:
            st = dp.state
            tokens, count, ctx = st._decode_lists()
            for i in dp.remaining:
                call = dp.calls[i]
                weight, own_ctx, kv, free_start = st._decode_inputs(call)
                for d in range(dp.num_decode):
                    if free_start:
                        want = (st.now, decode_end(st.tables, d, st.now, count, ctx, weight,
                                                   own_ctx))
                    else:
                        want = decode_terms(st.tables, d, st.now, tokens, count, ctx, weight,
                                            own_ctx, kv, st.slow_start)
                    assert st._decode_terms_at(call, d) == want
                    shortcut += free_start
                    full += not free_start
            slot = dp.picked.index(False)
            dp.pick(slot, *dp.best_pair(slot)[:2])
        dp = sim.run_until_decision()
    assert shortcut > 0
    if build is tight_memory_simulator:
        assert full > 0
