"""Ŝ's shortcut for "no decode limit binds" is exact and stays current pick by pick.

``PlanState.decode_starts`` returns ``now`` at once when the largest demand fits in the smallest
KV slack and no batch is full; the (smallest slack, any batch full) pair is built once per Ŝ and
updated by every commit. Checked against a from-scratch rebuild and against the full
computation, along real episodes whose decode memory binds and whose memory is plentiful.
"""

from __future__ import annotations

import numpy as np
import pytest

from hexagent_gym.decisions import Stage
from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.simulator import Simulator
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
