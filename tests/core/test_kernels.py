"""The compiled placement kernels (hexagent_gym.planning._kernels) equal their pure-Python
originals.

Every scalar prefill pair that decisions of real episodes use (one-call windows and, with the
kernels, windows of up to 16 calls) is recomputed by the Python rule and compared exactly (pair
and float), on clusters and traces that reach every branch: idle twins, prefix-
cache hits, estimation errors, and decode memory that binds (the slow-start callback). Whole
episodes run with the kernels on and off produce the same placements and times.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.planning import kernels
from hexagent_gym.planning.decisions import DecisionPoint, Stage
from hexagent_gym.policy import make_policy, run_policy
from tests.toy import tight_memory_simulator

pytestmark = pytest.mark.skipif(not kernels.AVAILABLE,
                                reason="the compiled kernels are not built (no C compiler)")


@pytest.fixture
def compare_both(monkeypatch):
    """Check every scalar prefill pair a decision uses (the one-call kernel or the window
    kernel) against the pure-Python rule, exactly; count the pairs and those where a decode
    limit binds."""
    kernels.use_compiled(True)
    scalar_pair = DecisionPoint._scalar_pair
    seen = {"picks": 0, "binding": 0}

    def checked(self, slot):
        pair = scalar_pair(self, slot)
        if self.stage == Stage.PREFILL:
            call = self.calls[slot]
            slow = self.state.best_prefill_pair_one_python(call, self._pf(call))
            assert pair == slow, (pair, slow)
            assert [type(x) for x in pair] == [type(x) for x in slow] == [int, int, float]
            seen["picks"] += 1
            seen["binding"] += not self.state._decode_inputs(call)[3]
        return pair

    monkeypatch.setattr(DecisionPoint, "_scalar_pair", checked)
    return seen


EPISODES = [
    dict(cluster="hetero-1-x2", trace="bfcl_v3", num_workflows=160, load=1.2),  # twins, hits
    dict(cluster="hetero-1", trace="mixed", num_workflows=60, load=3.0),  # DAGs, sample groups
    dict(cluster="asym-2p8d", trace="bfcl_v3", num_workflows=40, load=None,
         arrival_rate=40.0),  # overloaded: long windows, the last pick of each
    dict(cluster="hetero-1", trace="bfcl_v3", num_workflows=80, load=1.0, prefix_cache=False,
         estimation_error=0.3),
]


@pytest.mark.parametrize("config", EPISODES, ids=lambda c: f"{c['cluster']}-{c['trace']}")
def test_compiled_pairs_equal_python_on_every_pick(compare_both, config):
    sim = EpisodeFactory(EpisodeConfig(**config, seed=1)).simulator()
    run_policy(sim, make_policy("hexagent"))
    assert compare_both["picks"] > 50


def test_compiled_pairs_equal_python_where_decode_memory_binds(compare_both):
    for policy in ("hexagent", "hexagent-lb"):
        run_policy(tight_memory_simulator(), make_policy(policy))
    assert compare_both["binding"] > 0  # the slow-start callback ran


def _trajectory(sim) -> list:
    return [(c.prefill_inst, c.decode_inst, c.prefill_start, c.finish_t)
            for w in sim.workflows for c in w.calls]


@pytest.mark.parametrize("build", [
    lambda: EpisodeFactory(EpisodeConfig(cluster="hetero-1-x4", trace="bfcl_v3",
                                         num_workflows=200, load=1.0, seed=2)).simulator(),
    tight_memory_simulator,
], ids=["hetero-1-x4", "tight-memory"])
def test_episodes_are_identical_with_and_without_the_kernels(build):
    runs = []
    try:
        for on in (True, False):
            kernels.use_compiled(on)
            sim = build()
            result = run_policy(sim, make_policy("hexagent"))
            runs.append((_trajectory(sim), result.ratios.tolist()))
    finally:
        kernels.use_compiled(True)
    assert runs[0] == runs[1]
    assert all(math.isfinite(r) for r in runs[0][1])


def test_switch_selects_the_implementation():
    try:
        kernels.use_compiled(False)
        assert kernels.best_prefill_pairs is None
        kernels.use_compiled(True)
        assert kernels.best_prefill_pairs is not None
    finally:
        kernels.use_compiled(True)


def test_hand_computed_pairs_and_clear_errors():
    fn = kernels._compiled.best_prefill_pairs
    with pytest.raises(TypeError, match="takes 22 arguments, got 2"):
        fn(0.0, [1.0])
    # one prefill and one decode instance, idle; batch-size table clamped at 1: the decode step
    # is base[1] + slope[1]·ctx = 1.0 s; call 0 has weight 1: Δ = max(0 + 0, now) + 1.0 = 1.0;
    # call 1 has weight 2 and a 0.5 s prefill: Δ = 0.5 + 2.0 = 2.5; call 2 needs more KV than
    # the instance holds: no valid pair
    shared = [0.0, [0.0], [[0]], [0], [0], [0], [0.0], [0.0],
              [(100.0, 4, (0.0, 1.0), (0.0, 0.0))], 1, [100.0], None]
    calls = [[[0.0], [0.5], [0.0]], [((0.0,),)] * 3, None, [1.0, 2.0, 1.0], [1.0, 1.0, 1.0],
             [1.0, 1.0, 1.0], [1.0, 1.0, 101.0]]
    assert fn(*shared, *calls, 50.0, False, [0, 1, 2]) == [(0, 0, 1.0), (0, 0, 2.5),
                                                         (0, 0, math.inf)]
    assert fn(*shared, *calls, 50.0, False, [1]) == [(0, 0, 2.5)]
    # call 1 as a prompt length of 4 tokens: 0.25 s setup + 4 x 0.5 s = 2.25 s more transfer
    lengths = [calls[0], [((0.0,),), 4, ((0.0,),)], np.array([0.25, 0.5]).tobytes(), *calls[3:]]
    assert fn(*shared, *lengths, 50.0, False, [0, 1]) == [(0, 0, 1.0), (0, 0, 4.75)]
    # ties between prefill instances: three idle ones in two classes ([2, 1] and [0], stored in
    # that order), no transfer. Equal prefills: both classes reach the best, and the lowest p
    # of their members wins (0); a slower p0: only class [2, 1] does, and its first member in
    # stored order wins (2), as the Python rule iterates one class's members
    three = [0.0, [0.0] * 3, [[2, 1], [0]], [1, 0, 0], [0], [0], [0.0], [0.0],
             [(100.0, 4, (0.0, 1.0), (0.0, 0.0))], 1, [100.0], None]
    ties = [[[0.5, 0.5, 0.5], [0.6, 0.5, 0.5]], [((0.0, 0.0),)] * 2, None, [1.0, 1.0],
            [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]
    assert fn(*three, *ties, 50.0, False, [0, 1]) == [(0, 0, 1.5), (2, 0, 1.5)]
    bad = [[{0: 0.0}, [0.5], [0.0]], *calls[1:]]
    with pytest.raises(TypeError, match="pf must be a list or tuple, got dict"):
        fn(*shared, *bad, 50.0, False, [0])
    wrong = list(shared)
    wrong[5] = [0, 0]  # count longer than the decode instances
    with pytest.raises(ValueError, match="inconsistent sizes"):
        fn(*wrong, *calls, 50.0, False, [0])
    with pytest.raises(ValueError, match="per-call lists differ in length"):
        fn(*shared, calls[0], *calls[1:-1], [1.0], 50.0, False, [0])


def _before_every_pick(config: EpisodeConfig):
    """Yield the open decision point before each HexAgent pick of an episode."""
    sim = EpisodeFactory(config).simulator()
    policy = make_policy("hexagent")
    policy.reset(sim)
    dp = sim.run_until_decision()
    while dp is not None:
        while not dp.done:
            yield dp
            dp.pick(*policy.pick(dp))
        dp = sim.run_until_decision()


def test_window_kernel_equals_the_one_call_kernel_slot_by_slot():
    """best_prefill_pairs over a window equals the one-call pick per slot, at every pick of an
    episode with multi-call windows, and refuses a slot out of range."""
    kernels.use_compiled(True)
    config = EpisodeConfig(cluster="hetero-1-x4", trace="bfcl_v3", num_workflows=200,
                           load=1.2, seed=3)
    compared = 0
    for dp in _before_every_pick(config):
        if dp.stage == Stage.PREFILL:
            slots = [i for i, picked in enumerate(dp.picked) if not picked]
            many = dp.state.best_prefill_pairs(dp._kernel_inputs(), slots)
            one = [dp.state.best_prefill_pair_one(dp.calls[i], dp._pf(dp.calls[i]))
                   for i in slots]
            assert many == one
            compared += len(slots) > 1
    assert compared > 50
    with pytest.raises(IndexError, match="slot 99 out of range"):
        sim2 = EpisodeFactory(config).simulator()
        dp = sim2.run_until_decision()
        dp.state.best_prefill_pairs(dp._kernel_inputs(), [99])


def test_compiled_decode_scan_equals_python_at_every_pick():
    from hexagent_gym.planning.placement import decode_scan_python

    config = EpisodeConfig(cluster="hetero-1-x4", trace="bfcl_v3", num_workflows=150,
                           load=0.8, seed=6)
    checked = skipped = 0
    for dp in _before_every_pick(config):
        st = dp.state
        lists = (st.dec_tokens_l, st.dec_count_l, st.dec_ctx_l)
        fast = kernels._compiled.decode_scan(st.tables.dec_kind, *lists)
        assert fast == decode_scan_python(st.tables, *lists)
        checked += 1
        skipped += st.tables.num_decode - len(fast)
    assert checked > 300 and skipped > 1000  # idle twins were skipped


def test_compiled_decode_scan_by_hand():
    scan = kernels._compiled.decode_scan
    kind = [0, 1, 0, 0, 2, 0]
    count = [0, 0, 1, 0, 0, 0]
    tokens = [0.0, 0.0, 700.0, 0.0, 0.0, 0.0]
    # 0 first idle of kind 0; 1 idle of kind 1; 2 busy; 3 and 5 twins of 0; 4 its own kind
    assert scan(kind, tokens, count, [0.0, 0.0, 500.0, 0.0, 0.0, 0.0]) == [0, 1, 2, 4]
    # a context residue or committed tokens set an idle instance apart; -0.0 equals 0.0
    assert scan(kind, tokens, count, [0.0, 0.0, 500.0, 1e-12, 0.0, -0.0]) == [0, 1, 2, 3, 4]
    assert scan(kind, [0.0, 0.0, 700.0, 0.0, 0.0, 40.0], count, [0.0] * 6) == [0, 1, 2, 4, 5]
    with pytest.raises(ValueError, match="decode_scan: inconsistent sizes"):
        scan(kind, tokens, count, [0.0])


def test_compiled_prefill_free_times_equal_python():
    from hexagent_gym.planning.entities import prefill_free_times_python

    free = kernels._compiled.prefill_free_times
    # idle (-inf), running past now, running before now; queued work, none, a rounding residue
    run_end, queued = [-math.inf, 5.5, 1.0], [2.0, 0.0, -1e-12]
    assert free(run_end, 3.0, queued) == prefill_free_times_python(run_end, 3.0, queued) == [
        5.0, 5.5, 3.0]
    with pytest.raises(ValueError, match="prefill_free_times: inconsistent sizes"):
        free(run_end, 3.0, [0.0])
    # nothing queued: the run end's or now's float object itself, where it holds the same bits
    now, run_end = 3.0, [5.5, -math.inf, 1.0, -0.0]
    out = free(run_end, now, [0.0, -1.0, 0.0, 0.0])
    assert out[0] is run_end[0] and out[1] is now and out[2] is now
    neg = free([-math.inf], -0.0, [0.0])  # -0.0 + 0.0 is +0.0: a new float, as Python's
    assert neg == prefill_free_times_python([-math.inf], -0.0, [0.0])
    assert math.copysign(1.0, neg[0]) == 1.0
    config = EpisodeConfig(cluster="hetero-1-x2", trace="mixed", num_workflows=60, load=2.0,
                           seed=2)
    checked = replanned = 0
    for dp in _before_every_pick(config):
        loads = dp.state._decode[0].loads  # the engine's lists, through a live instance
        args = (loads.pf_run_end, dp.now, loads.pf_queued)
        assert free(*args) == prefill_free_times_python(*args)
        checked += 1
        if dp.stage == Stage.PREFILL and not dp.plan:  # Ŝ's free times as first built
            work = list(loads.pf_queued)  # the snapshot's rule: planned calls leave their queue
            for c in dp.calls:
                if c.decode_inst >= 0:
                    work[c.prefill_inst] -= c.pf_queued
                    replanned += 1
            assert dp.state.free_l == prefill_free_times_python(loads.pf_run_end, dp.now, work)
    assert checked > 100 and replanned > 20


def _prefill_picks(build):
    """Yield the open prefill decision point before each HexAgent pick of ``build()``'s episode."""
    sim = build()
    policy = make_policy("hexagent")
    policy.reset(sim)
    dp = sim.run_until_decision()
    while dp is not None:
        while not dp.done:
            if dp.stage == Stage.PREFILL:
                yield dp
            dp.pick(*policy.pick(dp))
        dp = sim.run_until_decision()


@pytest.mark.parametrize("build", [
    tight_memory_simulator,
    lambda: EpisodeFactory(EpisodeConfig(cluster="hetero-1-x4", trace="bfcl_v3",
                                         num_workflows=200, load=1.2, seed=3)).simulator(),
], ids=["tight-memory", "hetero-1-x4"])
def test_kernels_derive_the_limits_they_are_passed_as_none(build):
    """Passed (None, None) for the decode limits, the window kernels and risk_plan derive
    PlanState.limits from Ŝ's lists themselves (the pairs' kernels from the scan's instances
    only): the same answers as with the limits given, before every prefill pick, where
    reservations bind and batches fill (tight memory) and where idle twins sit out of the scan."""
    kernels.use_compiled(True)
    compiled = kernels._compiled
    checked = binding = 0
    for dp in _prefill_picks(build):
        st, t = dp.state, dp.state.tables
        assert st.kernel_limits() in ((None, None), st._limits)
        limits = st.limits()
        slots = dp.remaining
        head = (st.now, st.free_l, t.pf_members, t.pf_class_list)
        lists = (st.dec_count_l, st.dec_ctx_l, st.dec_tokens_l, t.dec_static, t.batch_top,
                 t.dec_capacity, st.slow_start, *dp._kernel_inputs())

        for scan in (st.decode_scan(), list(range(dp.num_decode))):
            assert (compiled.best_prefill_pairs(*head, scan, *lists, None, None, slots)
                    == compiled.best_prefill_pairs(*head, scan, *lists, *limits, slots))
        grids = [np.full((len(dp.calls), dp.num_prefill, dp.num_decode), np.inf)
                 for _ in range(2)]
        compiled.prefill_grid(*head, (), *lists, None, None, slots, grids[0])
        compiled.prefill_grid(*head, (), *lists, *limits, slots, grids[1])
        assert grids[0].tobytes() == grids[1].tobytes()
        plan_args = (*head, t.dec_kind, st.dec_count_l, st.dec_ctx_l, st.dec_tokens_l,
                     t.dec_static, t.batch_top, t.dec_capacity, *dp._kernel_inputs(),
                     [c.ctx_share for c in dp.calls], [c.workflow.arrival for c in dp.calls],
                     [c.workflow.h_est for c in dp.calls])
        assert (compiled.risk_plan(*plan_args, None, None, dp.picked)
                == compiled.risk_plan(*plan_args, *limits, dp.picked))
        checked += 1
        binding += limits[1] or limits[0] < max(c.kv_pred for c in dp.calls)
    assert checked > 20
    if build is tight_memory_simulator:
        assert binding > 0


@pytest.mark.parametrize("build", [
    *[lambda c=c: EpisodeFactory(EpisodeConfig(**c, seed=1)).simulator() for c in EPISODES],
    tight_memory_simulator,
], ids=[f"{c['cluster']}-{c['trace']}" for c in EPISODES] + ["tight-memory"])
def test_compiled_grid_equals_the_numpy_projection_at_every_pick(build):
    """The window's Δ tensor from the compiled kernel equals numpy's ``project_prefill`` (picked
    rows inf) entry for entry, bit for bit, before every prefill pick."""
    kernels.use_compiled(True)
    compared = binding = 0
    for dp in _prefill_picks(build):
        n, P, D = len(dp.calls), dp.num_prefill, dp.num_decode
        grid = np.full((n, P, D), np.inf)
        dp.state.prefill_grid(dp._kernel_inputs(), dp.remaining, grid)
        ref = dp.state.project_prefill(dp.batch)
        ref[np.asarray(dp.picked)] = np.inf
        assert grid.tobytes() == ref.tobytes()
        assert np.array_equal(dp.delta, ref)  # what the env observes
        compared += 1
        binding += any(not dp.state._decode_inputs(dp.calls[i])[3] for i in dp.remaining)
    assert compared > 20
    if build is tight_memory_simulator:
        assert binding > 0  # the slow-start callback ran


def test_compiled_grid_by_hand_and_clear_errors():
    fn = kernels._compiled.prefill_grid
    with pytest.raises(TypeError, match="takes 23 arguments, got 1"):
        fn(0.0)
    # two prefill instances (free at 0 and 0.25 s, one class), one decode instance whose step is
    # 1.0 s per unit of weight; transfer 0.125 s. Call 0 (weight 1, prefill 0.5 s on both):
    # Δ = (0 + 0.5 + 0.125) + 1.0 = 1.625 on p0 and 1.875 on p1. Call 1 needs more KV than d0
    # holds: inf. Row 2 is not asked for and keeps its -1.
    shared = [0.0, [0.0, 0.25], [[0, 1]], [0, 0], (), [0], [0.0], [0.0],
              [(100.0, 4, (0.0, 1.0), (0.0, 0.0))], 1, [100.0], None]
    calls = [[[0.5, 0.5]] * 3, [((0.125,),)] * 3, None, [1.0, 1.0, 1.0], [1.0, 1.0, 1.0],
             [1.0, 1.0, 1.0], [1.0, 101.0, 1.0]]
    out = np.full((3, 2, 1), -1.0)
    assert fn(*shared, *calls, 50.0, False, [0, 1], out) is None
    assert out[:, :, 0].tolist() == [[1.625, 1.875], [math.inf, math.inf], [-1.0, -1.0]]
    # call 0 as a prompt length of 2 tokens: the same 0.125 s transfer from the tables
    lengths = [calls[0], [2, *calls[1][1:]], np.array([0.025, 0.05]).tobytes(), *calls[3:]]
    again = np.full((3, 2, 1), -1.0)
    fn(*shared, *lengths, 50.0, False, [0, 1], again)
    assert again[:, :, 0].tolist() == [[0.025 + 2 * 0.05 + 1.5, 0.025 + 2 * 0.05 + 1.75],
                                       [math.inf, math.inf], [-1.0, -1.0]]
    with pytest.raises(ValueError, match="out must be float64 of 3 x 2 x 1"):
        fn(*shared, *calls, 50.0, False, [0], np.zeros((3, 2, 1), dtype=np.float32))
    with pytest.raises(ValueError, match="out must be float64 of 3 x 2 x 1"):
        fn(*shared, *calls, 50.0, False, [0], np.zeros((2, 2, 1)))
    with pytest.raises(BufferError, match="not writable"):
        fn(*shared, *calls, 50.0, False, [0], b"\0" * 48)
    with pytest.raises(IndexError, match="prefill_grid: slot 5 out of range"):
        fn(*shared, *calls, 50.0, False, [5], out)


def test_compiled_decode_limits_equal_python():
    from hexagent_gym.planning.plan_state import decode_limits_python

    limits = kernels._compiled.decode_limits
    # slack: the smallest capacity - tokens (-0.0 and 0.0 tie: the first is kept, as min does);
    # a batch at its limit makes any_full True
    cases = [([100.0, 50.0], [20.0, 50.0], [1, 3], [4, 4]),
             ([10.0, 10.0], [10.0, 10.0], [0, 4], [4, 4]),
             ([10.0], [-0.0], [0], [2])]
    for args in cases:
        fast, slow = limits(*args), decode_limits_python(*args)
        assert fast == slow and [type(x) for x in fast] == [type(x) for x in slow]
        assert math.copysign(1.0, fast[0]) == math.copysign(1.0, slow[0])
    assert limits(*cases[0]) == (0.0, False) and limits(*cases[1]) == (0.0, True)
    with pytest.raises(ValueError, match="decode_limits: inconsistent sizes"):
        limits([1.0], [0.0, 0.0], [0], [1])
    checked = tight = 0
    for dp in _prefill_picks(tight_memory_simulator):  # reservations bind there
        st = dp.state
        args = (st.tables.dec_capacity, st.dec_tokens_l, st.dec_count_l, st.tables.max_batch_list)
        assert limits(*args) == decode_limits_python(*args)
        checked += 1
        tight += limits(*args)[0] < 1000.0
    assert checked > 10 and tight > 0


@pytest.mark.parametrize("build", [
    *[lambda c=c: EpisodeFactory(EpisodeConfig(**c, seed=2)).simulator() for c in EPISODES],
    lambda: EpisodeFactory(EpisodeConfig(cluster="hetero-1-x8", trace="bfcl_v3",
                                         num_workflows=300, load=1.0, seed=0)).simulator(),
    tight_memory_simulator,
], ids=[f"{c['cluster']}-{c['trace']}" for c in EPISODES] + ["hetero-1-x8", "tight-memory"])
def test_risk_plan_equals_the_python_ranking_at_every_decision(build):
    """dp.risk_plan's picks are the pure-Python HexAgent's picks (slot, pair and Δ, exactly) at
    every prefill decision of several calls that HexAgent ranks pick by pick (up to its one-pass
    threshold), for as far as the plan goes."""
    from hexagent_gym.agents.hexagent import HexAgentPolicy

    class PythonRanking(HexAgentPolicy):
        def _ahead_pick(self, dp):
            return None

    kernels.use_compiled(True)
    sim = build()
    policy = PythonRanking()
    policy.reset(sim)
    compared = full = short = 0
    dp = sim.run_until_decision()
    while dp is not None:
        ranked = 1 < len(dp.calls) <= policy.one_pass_threshold  # longer: HexAgent ranks once
        plan = dp.risk_plan() if dp.stage == Stage.PREFILL and ranked else []
        dp._ahead = []  # the Python ranking projects every pick itself
        while not dp.done:
            dp.pick(*policy.pick(dp))
        for (slot, p, d, delta), (call, pp, dd, value) in zip(plan, dp.plan, strict=False):
            assert (dp.calls[slot], p, d) == (call, pp, dd)
            assert delta == value and type(delta) is float
            compared += 1
        if dp.stage == Stage.PREFILL and ranked:
            full += len(plan) == len(dp.calls)
            short += len(plan) < len(dp.calls)
        dp = sim.run_until_decision()
    if build is tight_memory_simulator:  # eight workflows: few multi-call windows
        assert compared > 3 and short > 0  # a decode limit bound: the plan stopped early
    else:
        assert compared > 20 and full > 5


def test_risk_plan_picks_need_no_projection_and_a_pick_off_plan_drops_it():
    kernels.use_compiled(True)
    config = EpisodeConfig(cluster="hetero-1-x4", trace="bfcl_v3", num_workflows=200, load=1.2,
                           seed=3)
    sim = EpisodeFactory(config).simulator()
    dp = sim.run_until_decision()
    while dp is not None and not (dp.stage == Stage.PREFILL and len(dp.calls) >= 3):
        while not dp.done:
            dp.pick(*make_policy("hexagent").pick(dp))
        dp = sim.run_until_decision()
    assert dp is not None
    plan = dp.risk_plan()
    assert len(plan) == len(dp.calls)
    slot, p, d, delta = plan[0]
    dp.pick(slot, p, d)
    assert dp.plan[-1][3] == delta and dp._batch is None  # Δ from the plan: nothing projected
    other = next(i for i, picked in enumerate(dp.picked) if not picked and i != plan[1][0])
    q, e, _ = dp.best_pair(other)
    dp.pick(other, q, e)  # off the plan
    assert dp._ahead == []


def test_compiled_match_levels_equal_python():
    from hexagent_gym.sim.prefix_cache import match_levels_python

    fn = kernels._compiled.match_levels
    holders = {10: 0b1011, 11: 0b0011, 12: 0b0001, 20: 1 << 63, 21: (1 << 64) - 1,
               30: (1 << 40) | 5, 31: 1 << 40, 32: (1 << 31) | (1 << 29)}  # multi-digit ints
    for blocks in ([10, 11, 12, 13], [10, 11], [11, 10], [99], [], (10, 11, 12), [20, 20],
                   [21, 20, 10], [30, 31], [21, 30, 31], [32, 21], [21, 32, 30]):
        assert fn(holders, blocks) == match_levels_python(holders, blocks)
    # caches 0 and 1 hold blocks 10 and 11, cache 3 only 10; cache 0 also 12
    assert fn(holders, [10, 11, 12, 13]) == [(1, 0b1000), (2, 0b0010), (3, 0b0001)]
    assert fn({1: 1 << 64}, [1]) is None  # wider than 64 bits: the Python version runs
    assert fn({1: -1}, [1]) is None  # not a mask: the Python version answers
    with pytest.raises(TypeError, match="holders must be a dict"):
        fn([], [1])
    # every prompt of an episode against the caches it left (32 prefill instances)
    config = EpisodeConfig(cluster="hetero-1-x4", trace="bfcl_v3", num_workflows=120, load=1.2,
                           seed=1)
    checked = 0
    sim = EpisodeFactory(config).simulator()
    run_policy(sim, make_policy("hexagent"))
    holders = sim.caches[0].holders
    for wf in sim.workflows:
        for call in wf.calls:
            assert fn(holders, call.spec.blocks) == match_levels_python(holders, call.spec.blocks)
            checked += 1
    assert checked > 200


@pytest.fixture
def compare_earliest(monkeypatch):
    """Check every placement the fallback rule makes (the engine's fallback, horizon replays,
    policies that place by it) against the pure-Python rule, exactly; count the calls with and
    without cache hits."""
    import hexagent_gym.planning.placement as placement

    kernels.use_compiled(True)
    fast = placement.earliest_pair
    seen = {"calls": 0, "hits": 0, "binding": 0}

    def checked(tables, now, free, tokens, count, ctx, call, slow_start, scan=None):
        used = []

        def counting(*args):
            used.append(args)
            return slow_start(*args)

        pair = fast(tables, now, free, tokens, count, ctx, call, counting, scan)
        slow = placement.earliest_pair_python(tables, now, free, tokens, count, ctx, call,
                                              slow_start, scan)
        assert pair == slow and [type(x) for x in pair] == [int, int, float], (pair, slow)
        seen["calls"] += 1
        seen["hits"] += call.cached is not None
        seen["binding"] += bool(used)
        return pair

    for module in ("hexagent_gym.planning.placement", "hexagent_gym.planning.plan_state",
                   "hexagent_gym.sim.horizon",
                   "hexagent_gym.sim.plan_flow"):
        mod = __import__(module, fromlist=["earliest_pair"])
        if hasattr(mod, "earliest_pair"):
            monkeypatch.setattr(mod, "earliest_pair", checked)
    return seen


@pytest.mark.parametrize("config,policy", [
    (dict(cluster="hetero-1-x2", trace="bfcl_v3", num_workflows=120, load=1.2), "fcfs"),
    (dict(cluster="hetero-1", trace="mixed", num_workflows=40, load=3.0), "hexagent"),
    (dict(cluster="hetero-1", trace="bfcl_v3", num_workflows=60, load=1.0,
          prefix_cache=False, estimation_error=0.3), "llf"),
], ids=["fcfs-cache", "mixed-dags", "no-cache"])
def test_compiled_earliest_pair_equals_python_on_every_placement(compare_earliest, config,
                                                                 policy):
    sim = EpisodeFactory(EpisodeConfig(**config, seed=4)).simulator()
    run_policy(sim, make_policy(policy))
    assert compare_earliest["calls"] > 50
    if config.get("prefix_cache", True):
        assert compare_earliest["hits"] > 0


def test_compiled_earliest_pair_where_decode_memory_binds():
    """Every waiting call of every prefill decision of the tight-memory toy, placed by both
    rules under that decision's Ŝ (whose reservations bind there)."""
    from hexagent_gym.planning.placement import earliest_pair_python

    kernels.use_compiled(True)
    assert kernels.earliest_pair is not None  # the compiled rule is the one placement_pair runs
    compared = binding = 0
    for dp in _prefill_picks(tight_memory_simulator):
        st = dp.state
        for i in dp.remaining:
            call = dp.calls[i]
            used = []

            def slow(*args, st=st, used=used):
                used.append(args)
                return st.slow_start(*args)

            lists = (st.dec_tokens_l, st.dec_count_l, st.dec_ctx_l)
            fast = placement_pair(st, call, slow)
            assert fast == earliest_pair_python(st.tables, st.now, st.free_l, *lists, call,
                                                st.slow_start)
            compared += 1
            binding += bool(used)
    assert compared > 20 and binding > 0  # the slow-start callback ran


def placement_pair(st, call, slow_start):
    from hexagent_gym.planning.placement import earliest_pair

    return earliest_pair(st.tables, st.now, st.free_l, st.dec_tokens_l, st.dec_count_l,
                         st.dec_ctx_l, call, slow_start)


def test_compiled_earliest_pair_errors():
    fn = kernels._compiled.earliest_pair
    with pytest.raises(TypeError, match="takes 21 arguments, got 1"):
        fn(0.0)
    args = [0.0, [0.0], [[0]], [(100.0, 4, (0.0, 1.0), (0.0, 0.0))], 1, [100.0], [[0.0]],
            [[0.0]], [0], [0.0], [0], [0.0], None, [0.5], None, [(0.25,)], 10, 1.0, 1.0,
            1.0, 1.0]
    # one instance each: prefill 0.5 s, transfer 0.25 s, decode step 1 s × weight 1
    assert fn(*args) == (0, 0, 1.75)
    wrong = list(args)
    wrong[15] = [(0.25,), (0.25,)]  # two transfer rows for one decode instance
    with pytest.raises(ValueError, match="earliest_pair: inconsistent sizes"):
        fn(*wrong)


def _observe_step_args(**change):
    """observe_step's arguments for 2 calls on 1 prefill x 2 decode instances, encoded into
    K=3, P_max=2, D_max=2 slots (a blank grid of -1) at 0.5 units per second, clipped at 100
    (columns: calls 0-2, prefill 1, decode 0 and 2, globals 0 and 1); ``change`` replaces some
    by name."""
    args = dict(
        delta=np.array([[[2.0, np.inf]], [[400.0, 6.0]]]),  # (0, 1) of call 0 invalid
        picked=[False, False], age=[0.0, 1.0], h_est=[1.0, 4.0], free=[5.0],
        tokens=[50.0, 0.0], count=[1, 0], capacity=[100.0, 10.0], max_batch=[4.0, 4.0],
        calls_t=np.full((3, 4), 7.0, np.float32), pre_t=np.full((2, 3), 7.0, np.float32),
        dec_t=np.full((2, 3), 7.0, np.float32), glob_t=np.full(3, 7.0, np.float32),
        cached_t=np.full((3, 2), 0.5, np.float32), grid_t=np.full((3, 2, 2), -1.0, np.float32),
        inv=0.5, clip=100.0, now=3.0, picks=0, cols=(0, 1, 2, 1, 0, 2, 0, 1))
    args.update(change)
    return list(args.values())


def test_compiled_observe_step_by_hand():
    fn = kernels._compiled.observe_step
    args = _observe_step_args()
    obs, mask = fn(*args)
    assert list(obs) == ["calls", "delta", "prefill", "decode", "globals", "cached"]
    assert all(a.dtype == np.float32 for a in obs.values()) and mask.dtype == bool
    grid = obs["delta"]
    assert grid.shape == (3, 2, 2)
    assert grid[0].tolist() == [[1.0, -1.0], [-1.0, -1.0]]
    assert grid[1].tolist() == [[100.0, 3.0], [-1.0, -1.0]]  # 400 s clipped at 100
    assert grid[2].tolist() == [[-1.0, -1.0], [-1.0, -1.0]]
    assert np.flatnonzero(mask).tolist() == [0, 4, 5]
    # row minima 2 s and 6 s: min Δ 1 and 3 units, risk (0 + 2) / 1 and (1 + 6) / 4
    assert obs["calls"][:2, :3].tolist() == [[0.0, 1.0, 2.0], [0.0, 3.0, 1.75]]
    assert obs["calls"][2].tolist() == [7.0] * 4  # the template beyond the window
    assert obs["calls"][:2, 3].tolist() == [7.0, 7.0]
    assert obs["prefill"][:, 1].tolist() == [1.0, 7.0]  # (5 - 3) * 0.5; padding untouched
    assert obs["decode"][:, 0].tolist() == [0.5, 0.0] and obs["decode"][:, 2].tolist() == [0.25,
                                                                                         0.0]
    assert obs["globals"].tolist() == [np.float32(2 / 3), 0.0, 7.0]
    assert obs["cached"].tolist() == [[0.5, 0.5]] * 3
    # fresh arrays: the templates are untouched and a second call shares no memory
    assert args[9].tolist() == [[7.0] * 4] * 3 and args[13].tolist() == [[0.5, 0.5]] * 3
    assert (args[14] == -1.0).all()
    again, mask2 = fn(*args)
    assert not any(np.shares_memory(again[k], obs[k]) for k in obs)
    assert not np.shares_memory(mask, mask2)
    # slot 0 picked (its row all inf): min and risk clip to 100; one pick of 3 slots
    obs, mask = fn(*_observe_step_args(delta=np.array([[[np.inf, np.inf]], [[400.0, 6.0]]]),
                                       picked=[True, False], picks=1))
    assert obs["calls"][0, :3].tolist() == [1.0, 100.0, 100.0]
    assert obs["globals"][:2].tolist() == [np.float32(1 / 3), np.float32(1 / 3)]
    assert np.flatnonzero(mask).tolist() == [4, 5]
    # a non-contiguous Δ is read as its contiguous copy
    strided = np.array([[[2.0, 9.0, np.inf, 9.0]], [[400.0, 9.0, 6.0, 9.0]]])[:, :, ::2]
    assert fn(*_observe_step_args(delta=strided))[0]["delta"].tolist() == grid.tolist()


def test_compiled_observe_step_errors_name_the_problem():
    fn = kernels._compiled.observe_step
    with pytest.raises(TypeError, match="takes 20 arguments"):
        fn(np.zeros((1, 1, 1)))
    with pytest.raises(ValueError, match="delta must be a float64"):
        fn(*_observe_step_args(delta=np.zeros((2, 1, 2), np.float32)))
    with pytest.raises(ValueError, match="calls_t must be a writable C-contiguous float32 array"):
        fn(*_observe_step_args(calls_t=np.zeros((3, 4))))
    with pytest.raises(ValueError, match="inconsistent sizes"):
        fn(*_observe_step_args(picked=[False]))
    with pytest.raises(ValueError, match="do not fit the templates"):
        fn(*_observe_step_args(cols=(0, 1, 9, 1, 0, 2, 0, 1)))
    with pytest.raises(ValueError, match="do not fit the templates"):
        fn(*_observe_step_args(grid_t=np.full((1, 2, 2), -1.0, np.float32)))
    with pytest.raises(ZeroDivisionError, match="a capacity is 0"):
        fn(*_observe_step_args(capacity=[100.0, 0.0]))


def test_compiled_risk_plan_by_hand_and_clear_errors():
    fn = kernels._compiled.risk_plan
    # one prefill and one decode instance (batch-size table clamped at 1: the decode step is
    # 1 s per unit of weight), two calls with 0.5 s prefills and no transfer. Call 1 arrived 1 s
    # before call 0 with the same horizon: riskier, so first: Δ = 0.5 + 1 = 1.5; then call 0
    # waits for the prefill instance: Δ = 0.5 + 0.5 + the decode step with two calls (1 s).
    static = [(100.0, 4, (0.0, 1.0), (0.0, 0.0))]
    args = [0.0, [0.0], [[0]], [0], [0], [0], [0.0], [0.0], static, 1, [100.0],
            [[0.5], [0.5]], [((0.0,),), ((0.0,),)], None, [1.0, 1.0], [1.0, 1.0], [1.0, 1.0],
            [1.0, 1.0], [1.0, 1.0], [0.0, -1.0], [10.0, 10.0], 50.0, False, [False, False]]
    assert fn(*args) == [(1, 0, 0, 1.5), (0, 0, 0, 2.0)]
    lengths = list(args)  # call 0 as its prompt length, its transfer from the tables:
    lengths[12] = [7, ((0.0,),)]  # 0 s setup + 7 tokens x 0 s per token
    lengths[13] = np.array([0.0, 0.0]).tobytes()
    assert fn(*lengths) == fn(*args)
    # 0.5 s setup + 7 x 0.25 s = 2.25 s transfer: call 0's Δ = 0.5 + 2.25 + 1 = 3.75 makes it
    # the riskier ((0 + 3.75) / 10 against (1 + 1.5) / 10), then call 1 decodes at 1.0 for 1 s
    lengths[13] = np.array([0.5, 0.25]).tobytes()
    assert fn(*lengths) == [(0, 0, 0, 3.75), (1, 0, 0, 2.0)]
    lengths[12] = [np.int64(7), ((0.0,),)]  # numpy's integers are lengths too
    assert fn(*lengths) == [(0, 0, 0, 3.75), (1, 0, 0, 2.0)]
    lengths[13] = np.zeros(3).tobytes()
    with pytest.raises(ValueError, match=r"xfer must be None or bytes of 2 x D x K doubles "
                                         r"\(16 bytes\), got bytes"):
        fn(*lengths)
    lengths[13] = None
    with pytest.raises(ValueError, match="a call's xcols is a prompt length but xfer is None"):
        fn(*lengths)
    lengths[12], lengths[13] = [-1, ((0.0,),)], np.zeros(2).tobytes()
    with pytest.raises(ValueError, match="a call's prompt length is negative"):
        fn(*lengths)
    picked = list(args)
    picked[23] = [False, True]  # call 1 already picked: only call 0 is left
    assert fn(*picked) == [(0, 0, 0, 1.5)]
    full = list(args)
    full[5], full[22] = [4], True  # d's batch is full: its start needs the releases (slow
    assert fn(*full) == []  # start), which the plan does not model: it stops at once
    spare = list(args)
    spare[22] = True  # some batch is full, but not d's and d has room: the plan goes on
    assert fn(*spare) == fn(*args)
    derived = list(full)
    derived[21] = derived[22] = None  # derived from the lists: 100 - 0 = 100 and d's batch full
    assert fn(*derived) == []
    derived[5] = [0]  # d's batch empty again: the derived limits bind nothing, as 50.0 / False
    assert fn(*derived) == fn(*args)
    with pytest.raises(TypeError, match="takes 24 arguments"):
        fn(0.0)
    short = list(args)
    short[20] = [10.0]  # one horizon for two calls
    with pytest.raises(ValueError, match="per-call lists differ in length"):
        fn(*short)


def _begin_fixture():
    """Two calls (the first of a workflow with no horizon yet, the second with a cached view
    and an empty prompt), one idle and one busy prefill instance, two decode instances."""
    from types import SimpleNamespace as NS
    wf0 = NS(arrival=1.0, h_est=0.0, num_done=0, service=0.0, open_calls=[1])
    wf1 = NS(arrival=2.0, h_est=4.0, num_done=3, service=1.5, open_calls=[1, 2])
    calls = [NS(workflow=wf0, reveal_t=2.0, transfer_end=9.0, l_in=99, l_out_pred=9,
                est_duration=0.5, cached=None),
             NS(workflow=wf1, reveal_t=3.0, transfer_end=9.0, l_in=0, l_out_pred=0,
                est_duration=2.0, cached=[0, 3])]
    prefill = [NS(queue=[], running=None), NS(queue=[1, 2, 3], running=object())]
    decode = [NS(batch=[1], max_batch=4, waiting=[]), NS(batch=[], max_batch=2, waiting=[1])]
    return calls, prefill, decode


@pytest.mark.parametrize("decode_stage", [False, True])
def test_compiled_begin_rows_by_hand_and_equal_to_python(decode_stage):
    from hexagent_gym.envs.encoding import _begin_rows_python
    calls, prefill, decode = _begin_fixture()

    def run(fn):
        # the arrays hold a previous window of 3 calls (9s): begin_rows clears its rows
        out = (np.full((3, 14), 9.0, np.float32), np.full((3, 2), 9.0, np.float32),
               np.zeros((2, 4), np.float32), np.zeros((2, 3), np.float32),
               np.zeros(3, np.float32))
        age, h, running, batched = fn(calls, decode_stage, 5.0, 0.5, 100.0, 10.0, out[0],
                                      out[1], 3, prefill, out[2], decode, out[3], [4.0, 2.0],
                                      (0, 1, 2, 0), out[4], (1.0, 0.1, 2.0))
        return age, h, (running, batched), out

    age, h, counts, (table, cached, pre, dec, glob) = run(kernels._compiled.begin_rows)
    assert age == [4.0, 3.0] and h == [1e-9, 4.0]  # a horizon of 0 is guarded above 0
    assert counts == (1, 1)  # one prefill running, one call in a decode batch
    # call 1: age 3 s and horizon 4 s at 0.5 units per s; waited since reveal (3 s) or the end
    # of its transfer (9 s, later than now: negative); log1p(0) tokens
    wait = (5.0 - (9.0 if decode_stage else 3.0)) * 0.5
    expected = [1.0, 0.0, 1.5, wait, 2.0, 0.75, 0.0, 0.0, 1.0, math.log1p(3), 0.75,
                math.log1p(2), 100.0, 100.0]
    assert table[1].tolist() == np.float32(expected).tolist()
    assert table[0, 5] == 0.0 and table[0, 6] == np.float32(math.log1p(99) / 10.0)
    assert table[2].tolist() == [0.0] * 14  # the previous window's row, cleared
    # hits [0, 3] of an empty prompt: divided by 1 and capped at 1; nothing at the decode stage
    assert cached.tolist() == ([[0, 0], [0, 0], [0, 0]] if decode_stage
                               else [[0, 0], [0.0, 1.0], [0, 0]])
    assert pre[:, 0].tolist() == [0.0, np.float32(math.log1p(3))]
    assert pre[:, 1].tolist() == [0.0, 1.0]
    assert dec[:, 2].tolist() == [0.25, 0.0] and dec[:, 0].tolist() == [0.0,
                                                                       np.float32(math.log1p(1))]
    assert glob.tolist() == [1.0, np.float32(0.1), 2.0]
    py_age, py_h, py_counts, py_out = run(_begin_rows_python)
    assert (age, h, counts) == (py_age, py_h, py_counts)
    for a, b in zip((table, cached, pre, dec, glob), py_out, strict=True):
        np.testing.assert_array_equal(a, b)


def _slotted(ns, cls=None):
    """A copy of a namespace as an instance of a __slots__ class (the core's entities are
    slotted: the compiled begin_rows reads their slots directly)."""
    cls = cls or type("Slotted", (), {"__slots__": tuple(vars(ns))})
    obj = cls()
    for k, v in vars(ns).items():
        if not isinstance(getattr(cls, k, None), property):  # (a subclass's override)
            setattr(obj, k, v)
    return obj


def test_compiled_begin_rows_reads_slots_as_attributes_do():
    """The direct slot reads give what attribute access gives: for slotted objects, for a
    subclass that overrides a slot with a property, after a class attribute is reassigned
    (a new lookup), and an unset slot raises the AttributeError naming it."""
    fn = kernels._compiled.begin_rows
    calls, prefill, decode = _begin_fixture()

    def run(calls, prefill=prefill, decode=decode):
        table, cached = np.zeros((3, 14), np.float32), np.zeros((3, 2), np.float32)
        pre, dec = np.zeros((2, 4), np.float32), np.zeros((2, 3), np.float32)
        age, h, running, batched = fn(calls, False, 5.0, 0.5, 100.0, 10.0, table, cached, 0,
                                      prefill, pre, decode, dec, [4.0, 2.0], (0, 1, 2, 0),
                                      np.zeros(1, np.float32), (0.0,))
        return age, h, running, batched, table.tolist(), cached.tolist(), pre.tolist(), \
            dec.tolist()

    call_cls = type("CallS", (), {"__slots__": tuple(vars(calls[0]))})
    wf_cls = type("WorkflowS", (), {"__slots__": tuple(vars(calls[0].workflow))})

    def slotted_call(ns, cls=call_cls):
        copy = _slotted(ns, cls)
        copy.workflow = _slotted(ns.workflow, wf_cls)
        return copy

    want = run(calls)
    slotted = [slotted_call(c) for c in calls]
    insts = [_slotted(x) for x in prefill], [_slotted(x) for x in decode]
    for _ in range(2):  # the second pass reads through the kept offsets
        assert run(slotted, *insts) == want

    class Override(call_cls):  # a property shadows the slot: it is what an attribute reads
        __slots__ = ()
        est_duration = property(lambda self: 8.0)

    from types import SimpleNamespace as NS
    assert run([slotted_call(calls[0], Override), slotted[1]]) == run(
        [NS(**{**vars(calls[0]), "est_duration": 8.0}), calls[1]])
    assert run(slotted) == want  # and the base type's slot is read again afterwards

    call_cls.l_out_pred = property(lambda self: 1000)  # the class changed: looked up anew
    try:
        assert run(slotted) == run([NS(**{**vars(c), "l_out_pred": 1000}) for c in calls])
    finally:
        del call_cls.l_out_pred  # (the slot's descriptor is gone with it; a fresh class
    unset = type("Unset", (), {"__slots__": tuple(vars(calls[0]))})()  # for the last check)
    for k, v in vars(calls[0]).items():
        if k != "l_out_pred":
            setattr(unset, k, v)
    with pytest.raises(AttributeError, match="l_out_pred"):
        run([unset])


def test_compiled_begin_rows_errors_name_the_problem():
    from types import SimpleNamespace as NS
    fn = kernels._compiled.begin_rows
    calls, prefill, decode = _begin_fixture()
    table, cached = np.zeros((3, 14), np.float32), np.zeros((3, 2), np.float32)
    pre, dec = np.zeros((2, 4), np.float32), np.zeros((2, 3), np.float32)
    glob = np.zeros(2, np.float32)

    def call(**change):
        args = dict(calls=calls, table=table, pre=pre, cols=(0, 1, 2, 0), decode=decode,
                    top=[4.0, 2.0], values=(0.0, 1.0), clear=0)
        args.update(change)
        return fn(args["calls"], False, 5.0, 0.5, 100.0, 10.0, args["table"], cached,
                  args["clear"], prefill, args["pre"], args["decode"], dec, args["top"],
                  args["cols"], glob, args["values"])

    with pytest.raises(TypeError, match="takes 17 arguments"):
        fn(calls)
    with pytest.raises(ValueError, match="table must be a writable C-contiguous float32"):
        call(table=np.zeros((3, 14)))
    with pytest.raises(ValueError, match="table must have 14 columns"):
        call(table=np.zeros((3, 13), np.float32))
    with pytest.raises(ValueError, match="out of range"):
        call(cols=(0, 9, 2, 0))
    with pytest.raises(ValueError, match="out of range"):
        call(clear=4)
    with pytest.raises(ValueError, match="glob_values one per glob entry"):
        call(values=(0.0,))
    with pytest.raises(AttributeError, match="l_out_pred"):
        call(calls=[NS(workflow=calls[0].workflow, reveal_t=0.0, transfer_end=0.0, l_in=1)])
    with pytest.raises(ValueError, match="one entry per prefill instance"):
        bad = NS(**{**vars(calls[1]), "cached": [1]})
        call(calls=[bad])
    with pytest.raises(ZeroDivisionError, match="max_batch is 0"):
        call(top=[0.0, 1.0])


@pytest.mark.parametrize("cluster", ["hetero-1", "hetero-2", "asym-2p8d", "hetero-1-x8"])
def test_compiled_standalone_estimate_equals_python(cluster):
    from hexagent_gym.cluster.cluster import load_cluster
    from hexagent_gym.planning.cluster_tables import ClusterTables

    tables = ClusterTables(load_cluster(cluster))
    rng = np.random.default_rng(3)
    for _ in range(300):
        l_in = int(rng.integers(1, 40_000))
        l_out = int(rng.integers(1, 4_000)) if rng.random() < 0.5 else float(rng.uniform(1, 4e3))
        err = 1.0 if rng.random() < 0.3 else float(rng.lognormal(0.0, 0.3))
        pf = [x * float(rng.uniform(0.5, 1.5)) for x in tables.prefill_times(l_in)[0]]
        fast = tables.standalone_estimate(pf, l_in, l_out, err)
        assert type(fast) is float
        assert fast == tables.standalone_estimate_python(pf, l_in, l_out, err)


def test_compiled_standalone_estimate_by_hand_and_errors():
    fn = kernels._compiled.standalone_estimate
    # one decode class (base 0.01, slope 1e-6), two prefill classes at instances 0 and 2:
    # ctx = 100 + 0.5 * (10 - 1) = 104.5; decode = 10 * (0.01 + 1e-6 * 104.5) * 2 = 0.20209
    # class 0: 1.0 + 0.1 + 100 * 0.001 + 0.20209; class 1: 0.5 + 0.2 + 100 * 0.002 + 0.20209
    got = fn([1.0, 9.0, 0.5], 100, 10, 2.0, [0.01], [1e-6], [0, 2], [0.1, 0.2], [0.001, 0.002])
    assert got == 0.5 + 0.2 + 100 * 0.002 + 10 * (0.01 + 1e-6 * 104.5) * 2.0
    assert fn([1.0], 1, 1, 1.0, [0.0], [0.0], [], [], []) == math.inf  # no class pair
    with pytest.raises(TypeError, match="standalone_estimate takes 9 arguments, got 1"):
        fn([1.0])
    with pytest.raises(IndexError, match=r"pair_p\[0\] = 5 is outside pf_est \(1 instances\)"):
        fn([1.0], 1, 1, 1.0, [0.0], [0.0], [5], [0.0], [0.0])
    with pytest.raises(ValueError, match="setup and spt K·J"):
        fn([1.0], 1, 1, 1.0, [0.0], [0.0], [0], [0.0, 1.0], [0.0])
    with pytest.raises(TypeError, match="pf_est must be a list or tuple, got dict"):
        fn({}, 1, 1, 1.0, [0.0], [0.0], [0], [0.0], [0.0])


@pytest.mark.parametrize("cluster", ["hetero-1", "asym-2p8d", "hetero-1-x8"])
def test_transfer_columns_equal_the_scalar_formula(cluster):
    from hexagent_gym.cluster.cluster import load_cluster
    from hexagent_gym.planning.cluster_tables import ClusterTables

    t = ClusterTables(load_cluster(cluster))
    for l_in in (1, 17, 1000, 32_767, 131_072):
        cols = t.transfer_cols(l_in)
        assert cols == tuple(tuple(t.setup_list[p][d] + l_in * t.spt_list[p][d]
                                   for p in t.pf_rep) for d in range(t.num_decode))
        assert all(type(x) is float for row in cols for x in row)
        # the kernels' form: the two tables, decode-instance-major, in one bytes object, from
        # which setup + L x s/token gives the same floats
        setup, spt = np.frombuffer(t.transfer_tables).reshape(2, t.num_decode, -1).tolist()
        assert cols == tuple(tuple(s + l_in * x for s, x in zip(srow, xrow, strict=True))
                             for srow, xrow in zip(setup, spt, strict=True))


@pytest.mark.parametrize("build", [
    tight_memory_simulator,  # decode limits bind, free calls move: both paths in one window
    lambda: EpisodeFactory(EpisodeConfig(cluster="hetero-1", trace="mixed", num_workflows=40,
                                         load=2.0, seed=3)).simulator(),
], ids=["tight-memory", "hetero-1-mixed"])
def test_compiled_decode_cells_equal_python_at_every_decode_decision(build):
    from hexagent_gym.planning.decisions import earliest_finish_pick

    sim, cells = build(), 0
    dp = sim.run_until_decision()
    try:
        while dp is not None:
            if dp.stage == Stage.DECODE:
                kernels.use_compiled(True)
                fast = dp._scalar_decode_delta()
                kernels.use_compiled(False)
                slow = dp._scalar_decode_delta()
                kernels.use_compiled(True)
                assert np.array_equal(fast, slow)
                cells += int(np.isfinite(fast).sum())
            while not dp.done:
                dp.pick(*earliest_finish_pick(dp))
            dp = sim.run_until_decision()
    finally:
        kernels.use_compiled(True)
    assert cells > 20


def test_compiled_decode_cells_by_hand_and_errors():
    fn = kernels._compiled.decode_cells
    out = np.full((2, 1, 2), np.inf)
    # decode instance 1 holds 1 call: the step terms at batch 2, base 0.02 + slope 1e-5 * ctx 300
    static = [(1000.0, 4, [0.0, 0.01, 0.015], [0.0, 1e-6, 2e-6]),
              (1000.0, 4, [0.0, 0.01, 0.02], [0.0, 1e-6, 1e-5])]
    fn(out, [1], [0], [1], [50.0], [120.0], 3.0, [0, 1], [0.0, 300.0], static, 2)
    assert out[1, 0, 1] == 3.0 + (50.0 * ((0.02 + 1e-5 * 300.0) + 1e-5 * 120.0) - 3.0)
    assert np.isinf(out[0]).all() and np.isinf(out[1, 0, 0])
    with pytest.raises(TypeError, match="decode_cells takes 11 arguments, got 1"):
        fn(out)
    with pytest.raises(IndexError, match=r"cell \(2, 0, 1\) is outside out \(2 x 1 x 2\)"):
        fn(out, [2], [0], [1], [1.0], [1.0], 0.0, [0, 0], [0.0, 0.0], static, 2)
    with pytest.raises(TypeError, match="out must be a writable C-contiguous float64"):
        fn(out.astype(np.float32), [], [], [], [], [], 0.0, [0, 0], [0.0, 0.0], static, 2)
    with pytest.raises(ValueError, match="one entry per cell"):
        fn(out, [0], [], [], [], [], 0.0, [0, 0], [0.0, 0.0], static, 2)


def _state_of(st) -> tuple:
    """Everything PlanState.commit_prefill_picks writes, with each number's type and bits."""
    def exact(values):
        return [(type(v), v.hex() if isinstance(v, float) else v) for v in values]

    log = [(type(d), d, when.hex(), kv.hex()) for d, when, kv in st._pick_log]
    return (exact(st.free_l), exact(st.pf_tokens_l), exact(st.dec_tokens_l),
            exact(st.dec_count_l), exact(st.dec_ctx_l), log, st._scan is None,
            None if st._limits is None else (exact([st._limits[0]]), st._limits[1]))


@pytest.mark.parametrize(("build", "idle_picked"), [
    (lambda: EpisodeFactory(EpisodeConfig(cluster="hetero-1-x4", trace="bfcl_v3",
                                          num_workflows=200, load=1.2, seed=3)).simulator(), True),
    (lambda: EpisodeFactory(EpisodeConfig(**EPISODES[3], seed=1)).simulator(), False),
    (tight_memory_simulator, True),
], ids=["hetero-1-x4", "errors-no-cache", "tight-memory"])
def test_compiled_commit_of_prefill_picks_equals_python(build, idle_picked):
    """Every plan of a HexAgent episode's multi-call prefill windows, committed to copies of Ŝ
    by the compiled loop and by the Python loop (cache-aware and not, with and without the
    decode limits and a kept scan): the same lists, log, scan and limits, object types and float
    bits included. ``idle_picked``: some plan places a call on an idle decode instance (the
    kept scan is dropped)."""
    from hexagent_gym.planning.plan_state import PlanState

    kernels.use_compiled(True)
    sim = build()
    policy = make_policy("hexagent")
    policy.reset(sim)
    checked = limited = dropped = 0
    dp = sim.run_until_decision()
    while dp is not None:
        if dp.stage == Stage.PREFILL and len(dp.calls) > 1:
            plan = dp.risk_plan()
            picks = [(dp.calls[slot], p, d, value) for slot, p, d, value in plan]
            st = dp.state
            variants = [(cache_aware, limits, scan) for cache_aware in (True, False)
                        for limits in (st.limits(), None) for scan in (st.decode_scan(), None)]
            for cache_aware, limits, scan in variants:
                states = []
                for on in (True, False):
                    copy = st.copy()
                    copy._releases, copy._tau_cache = {}, None
                    copy._limits, copy._scan = limits, scan
                    kernels.use_compiled(on)
                    try:
                        PlanState.commit_prefill_picks(copy, picks, cache_aware)
                    finally:
                        kernels.use_compiled(True)
                    states.append(_state_of(copy))
                assert states[0] == states[1]
                checked += 1
                limited += limits is not None
                dropped += scan is not None and states[0][6]
        while not dp.done:
            dp.pick(*policy.pick(dp))
        dp = sim.run_until_decision()
    assert checked > 8 and limited > 0 and (dropped > 0) == idle_picked


def test_compiled_commit_of_prefill_picks_by_hand_and_clear_errors():
    """Two picks on 2 prefill and 2 decode instances, worked out by hand: ints stay ints where
    Python keeps them so, the idle instance drops the scan, the limits take the lower slack."""
    from types import SimpleNamespace as Call

    fn = kernels._compiled.commit_prefill_picks
    a = Call(pf_est=(0.5, 0.25), pf_cold=(1.0, 2.0), l_in=100, kv_pred=300, ctx_share=150.0)
    b = Call(pf_est=(0.125, 4.0), pf_cold=(8.0, 8.0), l_in=50, kv_pred=60.5, ctx_share=75.0)
    free, pf_tokens, tokens, count, ctx, log = [1.0, 2.0], [0.0, 10.0], [0.0, 500.0], [0, 2], \
        [0.0, 900.0], []
    kept, limits = fn([(a, 1, 0, 0.75), (b, 0, 1, 1.5)], True, free, pf_tokens, tokens, count,
                      ctx, log, 10.0, [1000.0, 600.0], [4, 3], True, (900.0, False))
    assert free == [1.125, 2.25] and pf_tokens == [50.0, 110.0]
    assert tokens == [300.0, 560.5] and count == [1, 3] and ctx == [150.0, 975.0]
    assert [type(x) for x in count] == [int, int]
    assert log == [(0, 10.75, 300.0), (1, 11.5, 60.5)] and type(log[0][2]) is float
    assert kept is False  # decode 0 was idle (no call, no tokens): the scan is rebuilt
    assert limits == (39.5, True)  # min(900, 1000 - 300, 600 - 560.5); count 3 >= max_batch 3
    free2 = [1.0, 2.0]
    assert fn([(a, 0, 1, 0.0)], False, free2, [0.0, 0.0], [1.0, 1.0], [1, 1], [0.0, 0.0], [],
              0.0, [9.0, 9.0], [4, 4], True, None) == (True, None)
    assert free2 == [2.0, 2.0]  # not cache-aware: pf_cold
    lists = ([0.0], [0.0], [0.0], [0], [0.0], [])
    with pytest.raises(TypeError, match="free must be a list, got tuple"):
        fn([], True, (0.0,), *lists[1:], 0.0, [1.0], [1], True, None)
    with pytest.raises(TypeError, match=r"a pick must be a tuple \(call, p, d, delta\)"):
        fn([(a, 0, 0)], True, *lists, 0.0, [1.0], [1], True, None)
    with pytest.raises(IndexError, match=r"pick \(p=1, d=0\) outside 1 prefill and 1 decode"):
        fn([(a, 1, 0, 0.0)], True, *lists, 0.0, [1.0], [1], True, None)
    with pytest.raises(ValueError, match="inconsistent sizes"):
        fn([], True, *lists, 0.0, [1.0, 2.0], [1], True, None)
    with pytest.raises(TypeError, match="limits must be None or a pair"):
        fn([], True, *lists, 0.0, [1.0], [1], True, (1.0,))
    with pytest.raises(AttributeError, match="kv_pred"):
        fn([(Call(pf_est=(0.0,), l_in=1), 0, 0, 0.0)], True, *lists, 0.0, [1.0], [1], True, None)
