"""PDClusterEnv: spaces, action decoding, masks, observations, rewards, episode ends, config
errors, registration, checkers, vector envs and a short MaskablePPO run."""

from __future__ import annotations

import math
import pickle
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest

import hexagent_gym
from hexagent_gym.config import ConfigError
from hexagent_gym.envs.encoding import (
    CALL_FEATURES,
    CLIP,
    DECODE_FEATURES,
    GLOBAL_FEATURES,
    PREFILL_FEATURES,
    Encoder,
    MaskedDiscrete,
)
from hexagent_gym.envs.pd_cluster_env import CONFIG_KEYS, PDClusterEnv, make_env_fn
from hexagent_gym.envs.render import STEP_INFO_KEYS
from hexagent_gym.envs.rewards import make_reward, reward_names
from hexagent_gym.planning import kernels
from hexagent_gym.planning.decisions import Stage, earliest_finish_pick
from hexagent_gym.sim.metrics import attainment, req
from hexagent_gym.sim.simulator import Simulator
from hexagent_gym.workload.arrivals import EpisodeWorkload
from hexagent_gym.workload.workload import make_workflow
from tests.toy import ToyLatency, toy_cluster

ENV_ID = "hexagent_gym/PDCluster-v0"
TINY = dict(cluster="tiny-2p2d", trace="bfcl_v3", num_workflows=8, seed=3)
C = {name: i for i, name in enumerate(CALL_FEATURES)}
G = {name: i for i, name in enumerate(GLOBAL_FEATURES)}


def random_valid(env, rng):
    valid = np.flatnonzero(env.action_masks())
    return int(valid[rng.integers(len(valid))])


def advance_until(env, rng, cond, limit=10_000):
    """Step with random valid actions until ``cond(env)`` holds at an open decision point."""
    for _ in range(limit):
        if cond(env):
            return
        _, _, terminated, _, _ = env.step(random_valid(env, rng))
        assert not terminated, "episode ended before the condition held"
    raise AssertionError("condition never held")


@pytest.fixture
def env():
    return hexagent_gym.make(**TINY)


# -- spaces and action decoding -------------------------------------------------------------------
def test_spaces_have_the_documented_shapes(env):
    assert isinstance(env.action_space, MaskedDiscrete)
    assert isinstance(env.action_space, gym.spaces.Discrete)
    assert env.action_space.n == 16 * 2 * 2
    shapes = {k: s.shape for k, s in env.observation_space.spaces.items()}
    assert shapes == {"calls": (16, len(CALL_FEATURES)), "delta": (16, 2, 2),
                      "prefill": (2, len(PREFILL_FEATURES)), "decode": (2, len(DECODE_FEATURES)),
                      "globals": (len(GLOBAL_FEATURES),), "cached": (16, 2)}
    assert all(s.dtype == np.float32 for s in env.observation_space.spaces.values())


def test_action_index_is_slot_major_then_prefill_then_decode():
    env = hexagent_gym.make(**TINY, max_calls_per_decision=4, p_max=3, d_max=5)
    assert env.action_space.n == 4 * 3 * 5
    # a = (slot · P_max + p) · D_max + d
    cases = {0: (0, 0, 0), 1: (0, 0, 1), 4: (0, 0, 4), 5: (0, 1, 0), 14: (0, 2, 4),
             15: (1, 0, 0), 2 * 15 + 1 * 5 + 3: (2, 1, 3), 59: (3, 2, 4)}
    for a, triple in cases.items():
        assert env.decode_action(a) == triple
        assert env.encode_action(*triple) == a
    with pytest.raises(ValueError, match="outside the action grid"):
        env.encode_action(4, 0, 0)
    with pytest.raises(ValueError, match="outside the action grid"):
        env.encode_action(0, 3, 0)


# -- observations and masks ----------------------------------------------------------------------
def test_first_decision_of_the_tiny_episode_by_hand():
    env = hexagent_gym.make(**TINY, p_max=3, d_max=3)
    obs, _ = env.reset(seed=0)
    dp = env.decision_point
    assert dp.stage == Stage.PREFILL and len(dp.calls) == 1  # first workflow's source call
    call = dp.calls[0]
    mask = env.action_masks().reshape(16, 3, 3)
    expected = np.zeros((16, 3, 3), dtype=bool)
    expected[0, :2, :2] = True  # one call, 2 x 2 real instances, everything fits
    np.testing.assert_array_equal(mask, expected)
    # Δ: seconds / time_scale (10) on valid pairs, -1 elsewhere
    grid = obs["delta"]
    np.testing.assert_allclose(grid[0, :2, :2], dp.delta[0] / 10.0, rtol=1e-6)
    assert np.all(grid[~expected] == -1.0)
    row = obs["calls"][0]
    assert row[C["present"]] == 1.0 and row[C["picked"]] == 0.0
    assert row[C["age"]] == 0.0  # the decision opens at the workflow's arrival
    assert row[C["l_in"]] == pytest.approx(math.log1p(call.l_in) / 10.0, rel=1e-6)
    assert row[C["l_out_pred"]] == pytest.approx(math.log1p(call.l_out_pred) / 10.0, rel=1e-6)
    assert row[C["h_est"]] == pytest.approx(call.workflow.h_est / 10.0, rel=1e-6)
    assert row[C["min_delta"]] == pytest.approx(dp.delta[0].min() / 10.0, rel=1e-6)
    # empty cluster: the best projection is the call's standalone estimate, so risk is 1
    assert row[C["risk"]] == pytest.approx(1.0, rel=1e-5)
    assert np.all(obs["calls"][1:] == 0.0)
    g = obs["globals"]
    assert g[G["stage"]] == 0.0 and g[G["window"]] == 1 / 16 and g[G["arrived"]] == 1 / 8
    assert np.all(obs["prefill"][2] == 0.0) and np.all(obs["decode"][2] == 0.0)  # padding
    assert obs["prefill"][0, 0] == obs["prefill"][1, 0] == 1.0  # present


def test_a_picked_slot_is_masked_and_projections_see_the_pick(env):
    rng = np.random.default_rng(0)
    env.reset(seed=3)  # an episode with a prefill decision of two calls (seed 0 has none)
    advance_until(env, rng, lambda e: e.decision_point.stage == Stage.PREFILL
                  and len(e.decision_point.calls) >= 2 and not any(e.decision_point.picked))
    dp = env.decision_point
    before = env.action_masks().reshape(16, 2, 2)
    assert before[0].any() and before[1].any()
    p, d = np.argwhere(before[1])[0]
    obs, reward, terminated, truncated, _ = env.step(env.encode_action(1, int(p), int(d)))
    assert env.decision_point is dp and reward == 0.0 and not terminated and not truncated
    after = env.action_masks().reshape(16, 2, 2)
    assert not after[1].any() and after[0].any()
    assert obs["calls"][1, C["picked"]] == 1.0 and obs["calls"][0, C["picked"]] == 0.0
    assert np.all(obs["delta"][1] == -1.0)
    assert obs["globals"][G["picks"]] == 1 / 16
    # Ŝ: the chosen prefill instance is now busy for the picked call's prefill
    assert obs["prefill"][p, PREFILL_FEATURES.index("free_in")] > 0.0


def test_decode_stage_allows_only_the_locked_pair(env):
    rng = np.random.default_rng(1)
    env.reset(seed=0)
    advance_until(env, rng, lambda e: e.decision_point.stage == Stage.DECODE)
    dp = env.decision_point
    mask = env.action_masks().reshape(16, 2, 2)
    for slot, call in enumerate(dp.calls):
        expected = np.zeros((2, 2), dtype=bool)
        expected[call.prefill_inst, call.decode_inst] = True
        np.testing.assert_array_equal(mask[slot], expected)
    assert not mask[len(dp.calls):].any()
    obs = env.step(env.encode_action(0, dp.calls[0].prefill_inst, dp.calls[0].decode_inst))[0]
    assert obs["globals"][G["stage"]] in (0.0, 1.0)


def test_pairs_whose_decode_instance_cannot_hold_the_kv_are_masked():
    # toy cluster: decode 1 holds 1000 tokens; the 2000-token call fits only on decode 0
    lm = ToyLatency()
    cluster = toy_cluster(prefill=(lm, lm), decode=(lm, lm), capacity=(100_000, 1000))
    wf = make_workflow([(2000, 50, 0.0, []), (500, 50, 0.0, [])], "w")
    sim = Simulator(cluster, EpisodeWorkload((wf,), np.zeros(1), np.arange(1)),
                    max_calls_per_decision=4)
    dp = sim.run_until_decision()
    enc = Encoder(cluster, sim.tables, k=4, p_max=3, d_max=3, time_scale=1.0)
    enc.begin(sim, dp, num_workflows=1)
    obs, mask = enc.observe()
    mask = mask.reshape(4, 3, 3)
    expected = np.zeros((4, 3, 3), dtype=bool)
    expected[0, :2, 0] = True  # big call: decode 0 only
    expected[1, :2, :2] = True  # small call: everywhere
    np.testing.assert_array_equal(mask, expected)
    np.testing.assert_allclose(obs["delta"][0, :2, 0], dp.delta[0, :, 0], rtol=1e-6)
    assert np.all(obs["delta"][0, :, 1:] == -1.0)
    assert obs["prefill"][0, PREFILL_FEATURES.index("gpu_other")] == 1.0  # toy GPU "g0"
    assert obs["decode"][0, DECODE_FEATURES.index("capacity")] == pytest.approx(
        math.log1p(100_000) / 10, rel=1e-6)


def reference_dynamic_features(env) -> dict[str, np.ndarray]:
    """The features that change with each pick, computed directly with numpy in float64 from
    the open decision point (Δ tensor, Ŝ arrays, the calls' workflows), then cast to float32
    as the observation stores them."""
    dp, enc = env.decision_point, env.unwrapped.encoder
    P, D, inv = enc.num_prefill, enc.num_decode, 1.0 / env.unwrapped.options.time_scale
    n = len(dp.calls)
    flat = dp.delta.reshape(n, P * D)
    fin = np.isfinite(flat)
    grid = np.full((enc.k, enc.p_max, enc.d_max), -1.0)
    grid[:n, :P, :D] = np.where(fin, np.minimum(flat * inv, CLIP), -1.0).reshape(n, P, D)
    best = flat.min(axis=1)
    age = np.array([dp.now - c.workflow.arrival for c in dp.calls])
    h = np.array([c.workflow.h_est if c.workflow.h_est > 0.0 else 1e-9 for c in dp.calls])
    tables = env.simulator.tables
    return {
        "delta": grid.astype(np.float32),
        "min_delta": np.minimum(best * inv, CLIP).astype(np.float32),
        "risk": np.minimum((age + best) / h, CLIP).astype(np.float32),
        "free_in": np.minimum((dp.state.free - dp.now) * inv, CLIP).astype(np.float32),
        "committed_kv": np.minimum(dp.state.dec_tokens / tables.capacity, CLIP).astype(np.float32),
        "committed_count": np.minimum(dp.state.dec_count / tables.max_batch,
                                      CLIP).astype(np.float32),
    }


@pytest.mark.parametrize("overrides", [
    dict(cluster="hetero-1", trace="bfcl_v3", num_workflows=40, arrival_rate=60.0, seed=1),
    dict(cluster="hetero-1-lowmem", trace="agent_sessions", num_workflows=8, load=3.0, seed=3,
         p_max=10, d_max=9, max_calls_per_decision=4),
], ids=["hetero-1", "lowmem-padded"])
@pytest.mark.parametrize("compiled", [True, False], ids=["kernels", "python"])
def test_dynamic_features_equal_a_direct_numpy_computation_at_every_step(overrides, compiled):
    # observe() builds these from Python lists and, when built, the compiled Δ encoding; every
    # value must be the one the plain float64 numpy expressions give, at every pick of a whole
    # episode, with the kernels and without
    if compiled and not kernels.AVAILABLE:
        pytest.skip("the compiled kernels are not built")
    kernels.use_compiled(compiled)
    try:
        _check_dynamic_features(overrides)
    finally:
        kernels.use_compiled(True)


@pytest.mark.parametrize("overrides", [
    dict(cluster="hetero-1", trace="bfcl_v3", num_workflows=40, arrival_rate=60.0, seed=1),
    dict(cluster="hetero-1-lowmem", trace="agent_sessions", num_workflows=8, load=3.0, seed=3,
         p_max=10, d_max=9, max_calls_per_decision=4),
    dict(cluster="hetero-1", trace="mixed", num_workflows=20, load=3.0, seed=2),
], ids=["hetero-1", "lowmem-padded", "mixed"])
def test_whole_observations_are_the_same_with_and_without_the_kernels(overrides):
    # every key of every observation (the per-decision rows of begin_rows included) and every
    # mask, bit for bit, along one episode of the same random valid actions
    if not kernels.AVAILABLE:
        pytest.skip("the compiled kernels are not built")

    def episode(compiled):
        kernels.use_compiled(compiled)
        try:
            env = hexagent_gym.make(**overrides)
            rng = np.random.default_rng(4)
            obs, info = env.reset(seed=0)
            seen = [(obs, env.action_masks(), info)]
            terminated = False
            while not terminated:
                obs, _, terminated, _, info = env.step(random_valid(env, rng))
                seen.append((obs, env.action_masks(), info))
            return seen
        finally:
            kernels.use_compiled(True)

    fast, slow = episode(True), episode(False)
    assert len(fast) == len(slow) > 50
    cached_rows = 0
    for (a, ma, ia), (b, mb, ib) in zip(fast, slow, strict=True):
        # the running counts come from begin_rows with the kernels; key by key: the info's
        # action_mask is an array
        assert ia.keys() == ib.keys() and all(np.array_equal(ia[k], ib[k]) for k in ia)
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].dtype == b[key].dtype
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        np.testing.assert_array_equal(ma, mb)
        cached_rows += int((a["cached"] > 0).any())
    if overrides["trace"] != "agent_sessions":
        assert cached_rows > 0  # prefix-cache hits were encoded along the way


def _check_dynamic_features(overrides):
    env = hexagent_gym.make(**overrides)
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    P, D = env.unwrapped.encoder.num_prefill, env.unwrapped.encoder.num_decode
    pf, dc = PREFILL_FEATURES.index("free_in"), DECODE_FEATURES.index("committed_kv")
    dn = DECODE_FEATURES.index("committed_count")
    steps = 0
    while env.decision_point is not None:
        ref = reference_dynamic_features(env)
        n = len(env.decision_point.calls)
        np.testing.assert_array_equal(obs["delta"], ref["delta"])
        np.testing.assert_array_equal(obs["calls"][:n, C["min_delta"]], ref["min_delta"])
        np.testing.assert_array_equal(obs["calls"][:n, C["risk"]], ref["risk"])
        np.testing.assert_array_equal(obs["prefill"][:P, pf], ref["free_in"])
        np.testing.assert_array_equal(obs["decode"][:D, dc], ref["committed_kv"])
        np.testing.assert_array_equal(obs["decode"][:D, dn], ref["committed_count"])
        np.testing.assert_array_equal(env.action_masks().reshape(ref["delta"].shape),
                                      ref["delta"] != -1.0)
        obs, _, terminated, _, _ = env.step(random_valid(env, rng))
        steps += 1
        if terminated:
            break
    assert steps > 50


def test_observations_stay_in_bounds_and_are_fresh_over_a_whole_episode(env):
    rng = np.random.default_rng(2)
    obs, _ = env.reset(seed=1)
    assert env.observation_space.contains(obs)
    prev = obs
    steps = 0
    while True:
        obs, reward, terminated, truncated, info = env.step(random_valid(env, rng))
        steps += 1
        assert type(reward) is float and type(terminated) is bool and type(truncated) is bool
        assert env.observation_space.contains(obs), {k: (v.min(), v.max()) for k, v in obs.items()}
        assert all(np.isfinite(v).all() for v in obs.values())
        assert not any(np.shares_memory(obs[k], prev[k]) for k in obs)
        prev = obs
        if terminated:
            break
        assert set(info) == set(STEP_INFO_KEYS) and not truncated
        assert info["sim_time"] == env.simulator.now
    assert steps == env.simulator.decisions_made
    assert not env.action_masks().any()  # nothing valid after the drain
    assert np.all(obs["calls"] == 0.0) and np.all(obs["delta"] == -1.0)
    assert info["num_workflows"] == info["num_finished"] == 8
    result = env.simulator.result()
    assert info["req99"] == result.req99 and info["req95"] == result.req95
    assert info["attainment"] == result.attainment(1.5)
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(0)


def test_action_space_sample_draws_valid_actions_and_pickles_as_discrete(env):
    env.reset(seed=0)
    env.action_space.seed(0)
    for _ in range(20):
        a = env.action_space.sample()
        assert env.action_masks()[a]
        env.step(a)
    explicit = np.zeros(env.action_space.n, dtype=np.int8)
    explicit[5] = 1
    assert env.action_space.sample(mask=explicit) == 5
    clone = pickle.loads(pickle.dumps(env.action_space))
    assert clone == gym.spaces.Discrete(env.action_space.n) and clone.mask_source is None
    assert 0 <= clone.sample() < env.action_space.n


# -- invalid actions -----------------------------------------------------------------------------
def test_invalid_actions_raise_and_change_nothing():
    env = hexagent_gym.make(**TINY, p_max=3, d_max=3)
    rng = np.random.default_rng(0)
    env.reset(seed=3)  # an episode with a prefill decision of two calls (seed 0 has none)
    advance_until(env, rng, lambda e: e.decision_point.stage == Stage.PREFILL
                  and len(e.decision_point.calls) >= 2 and not any(e.decision_point.picked))
    n = len(env.decision_point.calls)
    mask = env.action_masks()
    bad = {
        env.action_space.n: "out of range",
        -1: "out of range",
        env.encode_action(n, 0, 0): f"call slot {n} is empty; this decision point has {n}",
        env.encode_action(0, 2, 0): "prefill slot 2 is padding; the cluster has 2 prefill",
        env.encode_action(0, 0, 2): "decode slot 2 is padding; the cluster has 2 decode",
    }
    for a, msg in bad.items():
        with pytest.raises(ValueError, match=msg):
            env.step(a)
    with pytest.raises(ValueError, match="must be an integer index"):
        env.step(1.5)
    np.testing.assert_array_equal(env.action_masks(), mask)
    assert not any(env.decision_point.picked)
    env.step(env.encode_action(0, 0, 0))
    with pytest.raises(ValueError, match=r"action 0 = \(slot 0, prefill 0, decode 0\): call slot 0 "
                                         r"was already picked"):
        env.step(0)
    advance_until(env, rng, lambda e: e.decision_point.stage == Stage.DECODE)
    call = env.decision_point.calls[0]
    wrong = (call.prefill_inst, 1 - call.decode_inst)
    # a call its decode instance can admit now stays there (free calls move only when blocked)
    with pytest.raises(ValueError, match="cannot move to decode instance"):
        env.step(env.encode_action(0, *wrong))
    env.step(np.array([env.encode_action(0, call.prefill_inst, call.decode_inst)]))  # (1,) array ok


# -- determinism and seeding ---------------------------------------------------------------------
def trajectory(env, seed, action_seed, steps=200):
    rng = np.random.default_rng(action_seed)
    out = [env.reset(seed=seed)[0]]
    rewards = []
    for _ in range(steps):
        obs, r, terminated, _, _ = env.step(random_valid(env, rng))
        out.append(obs)
        rewards.append(r)
        if terminated:
            break
    return out, rewards


def test_same_seed_and_actions_give_the_same_trajectory():
    a_obs, a_rew = trajectory(hexagent_gym.make(**TINY), seed=7, action_seed=1)
    b_obs, b_rew = trajectory(hexagent_gym.make(**TINY), seed=7, action_seed=1)
    assert a_rew == b_rew and len(a_obs) == len(b_obs)
    for x, y in zip(a_obs, b_obs, strict=True):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])
    c_obs, _ = trajectory(hexagent_gym.make(**TINY), seed=8, action_seed=1)
    assert any(not np.array_equal(x["calls"], y["calls"])
               for x, y in zip(a_obs, c_obs, strict=False))


def test_reset_seeding_follows_gymnasium_and_defaults_to_the_config_seed():
    env = hexagent_gym.make(**TINY)
    _, first = env.reset()  # unseeded first reset: the config's seed (3)
    assert first["episode_seed"] == env.episode_seed_for(None) == env.episode_seed_for(3) == 3
    _, again = env.reset()  # the stream continues: another episode
    assert again["episode_seed"] != first["episode_seed"]
    _, s1 = env.reset(seed=42)
    _, s2 = env.reset(seed=42)
    assert s1.keys() == s2.keys() and all(np.array_equal(s1[k], s2[k]) for k in s1)
    assert s1["episode_seed"] == env.episode_seed_for(42) == 42
    _, n1 = env.reset()  # after a seeded reset the stream is the one that seed starts
    _, s3 = env.reset(seed=42)
    _, n2 = env.reset()
    assert n1.keys() == n2.keys() and all(np.array_equal(n1[k], n2[k]) for k in n1)
    assert n1["episode_seed"] != 42


# -- rewards and episode ends --------------------------------------------------------------------
def run_fallback(env, seed=0):
    env.reset(seed=seed)
    rewards = []
    while True:
        dp = env.decision_point
        done_before = len(env.simulator.finished)
        closes = len(dp.remaining) == 1
        _, r, terminated, _, info = env.step(env.encode_action(*earliest_finish_pick(dp)))
        if not closes:
            assert r == 0.0 and len(env.simulator.finished) == done_before
        rewards.append(r)
        if terminated:
            return rewards, env.simulator.result().ratios, info


def test_tail_reward_penalises_overshoot_and_the_tail():
    env = hexagent_gym.make(**TINY, arrival_rate=100.0, target_alpha=1.05)  # a burst
    rewards, ratios, info = run_fallback(env)
    assert (ratios > 1.05).any() and (ratios <= 1.05).any()
    expected = -np.maximum(ratios - 1.05, 0.0).sum() - (req(ratios, 0.99) - 1.0)
    assert sum(rewards) == pytest.approx(expected, rel=1e-9)
    assert info["episode_return"] == pytest.approx(expected, rel=1e-9)
    assert info["attainment"] == attainment(ratios, 1.05)


def test_attainment_and_mean_ratio_rewards():
    env = hexagent_gym.make(**TINY, arrival_rate=100.0, reward="attainment", target_alpha=1.05)
    rewards, ratios, _ = run_fallback(env)
    assert 0.0 < attainment(ratios, 1.05) < 1.0
    assert sum(rewards) == pytest.approx(attainment(ratios, 1.05), rel=1e-12)
    env = hexagent_gym.make(**TINY, arrival_rate=100.0, reward="mean_ratio")
    rewards, ratios, _ = run_fallback(env)
    assert sum(rewards) == pytest.approx(-(ratios - 1.0).sum(), rel=1e-9)
    env = hexagent_gym.make(**TINY, arrival_rate=100.0, reward="tail",
                            reward_kwargs={"terminal_weight": 0})
    rewards, ratios, _ = run_fallback(env)
    assert sum(rewards) == pytest.approx(-np.maximum(ratios - 1.5, 0.0).sum(), rel=1e-9)


def test_reward_registry_rejects_unknown_names():
    assert {"tail", "attainment", "mean_ratio"} <= set(reward_names())
    with pytest.raises(ConfigError, match="unknown reward 'tial'.*Did you mean: `tail`"):
        make_reward("tial", 1.5)
    with pytest.raises(ConfigError, match="unknown reward"):
        hexagent_gym.make(**TINY, reward="nope")
    with pytest.raises(ConfigError, match="does not accept reward_kwargs"):
        hexagent_gym.make(**TINY, reward_kwargs={"bogus": 1})


def test_max_steps_truncates_with_partial_stats_and_no_terminal_term():
    env = hexagent_gym.make(**TINY, max_steps=5)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    for i in range(5):
        _, _, terminated, truncated, info = env.step(random_valid(env, rng))
        assert not terminated
        assert truncated == (i == 4)
    assert info["num_workflows"] == 8 and info["num_finished"] < 8
    assert set(info) >= {"req95", "req99", "attainment", "mean_ratio", "sim_seconds"}


# -- configuration -------------------------------------------------------------------------------
def test_config_errors_name_the_problem():
    with pytest.raises(ConfigError, match=r"unknown key 'rewrd' for PDClusterEnv\. Did you mean: "
                                          r"`reward`\?.*Valid keys: cluster, trace"):
        hexagent_gym.make(**TINY, rewrd="tail")
    with pytest.raises(ConfigError, match=r"has 2 prefill and 2 decode instances but p_max=1"):
        hexagent_gym.make(**TINY, p_max=1)
    with pytest.raises(ConfigError, match="time_scale must be a number > 0"):
        hexagent_gym.make(**TINY, time_scale=0)
    with pytest.raises(ConfigError, match="max_steps must be an integer >= 1"):
        hexagent_gym.make(**TINY, max_steps=0)
    with pytest.raises(ConfigError, match="num_workflows"):
        hexagent_gym.make(**TINY | {"num_workflows": 0})
    with pytest.raises(ConfigError, match="unknown render_mode='human'; valid: ansi"):
        PDClusterEnv(render_mode="human", **TINY)
    with pytest.raises(ConfigError, match="action_mask_in_obs must be true or false"):
        hexagent_gym.make(**TINY, action_mask_in_obs="yes")
    assert {"cluster", "trace", "num_workflows", "arrival_rate", "load", "seed",
            "estimation_error", "reward", "max_calls_per_decision", "p_max", "d_max",
            "max_steps", "time_scale", "target_alpha"} <= set(CONFIG_KEYS)


def test_config_mapping_and_overrides(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("cluster: tiny-2p2d\ntrace: bfcl_v3\nnum_workflows: 8\n"
                    "max_calls_per_decision: 4\ntime_scale: 5.0\n")
    env = hexagent_gym.make(str(path), num_workflows=6, estimation_error=0.2)
    assert env.k == 4 and env.action_space.n == 4 * 2 * 2
    assert env.config.num_workflows == 6 and env.config.estimation_error == 0.2
    assert env.config.max_calls_per_decision == 4 and env.options.time_scale == 5.0
    env.reset(seed=0)
    assert len(env.simulator.workload.workflows) == 6
    env = hexagent_gym.make({"cluster": "tiny-2p2d", "num_workflows": 8}, arrival_rate=2.0)
    assert env.factory.arrival_rate == 2.0 and env.k == 16


def test_shipped_evaluation_experiments_are_valid_configs():
    env = hexagent_gym.make("default", num_workflows=8)
    assert env.config.cluster == "hetero-1" and env.config.arrival_rate == 40.0  # from the file
    assert env.config.load is None
    env.reset(seed=0)
    with pytest.raises(ConfigError, match="unknown key 'grid'"):
        hexagent_gym.make(**TINY, grid={})  # only a file's evaluation keys are ignored


def test_larger_instance_slots_pad_without_changing_the_episode():
    plain = hexagent_gym.make(**TINY)
    padded = hexagent_gym.make(**TINY, p_max=4, d_max=3)
    assert padded.observation_space["delta"].shape == (16, 4, 3)
    ratios_plain = run_fallback(plain, seed=2)[1]
    ratios_padded = run_fallback(padded, seed=2)[1]
    np.testing.assert_array_equal(ratios_plain, ratios_padded)


# -- Gymnasium / SB3 compatibility ---------------------------------------------------------------
def test_gymnasium_check_env_passes():
    from gymnasium.utils.env_checker import check_env

    env = gym.make(ENV_ID, **TINY)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # gymnasium's checker warns on soft failures
        check_env(env.unwrapped, skip_render_check=True)


def test_sb3_check_env_passes():
    from stable_baselines3.common.env_checker import check_env

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(hexagent_gym.make(**TINY), warn=True)
    # the only remarks are about the structured (non-1D) float boxes, which SB3's checker takes
    # for images; MultiInputPolicy flattens them (images must be uint8)
    for w in caught:
        msg = str(w.message)
        assert "image" in msg or "unconventional shape" in msg, msg


def test_registration_through_gymnasiums_own_mechanisms():
    code = {
        "gymnasium first": "import gymnasium as gym, hexagent_gym\n"
                           "env = gym.make('hexagent_gym/PDCluster-v0', "
                           "cluster='tiny-2p2d', num_workflows=4)\n",
        "hexagent_gym first": "import sys, hexagent_gym\n"
                              "assert 'gymnasium' not in sys.modules\n"
                              "import gymnasium as gym\n"
                              "env = gym.make('hexagent_gym/PDCluster-v0', "
                              "cluster='tiny-2p2d', num_workflows=4)\n",
        "gymnasium imported by another module": "import hexagent_gym\n"
                                                "from gymnasium.spaces import Box\n"
                                                "import gymnasium as gym\n"
                                                "env = gym.make('hexagent_gym/PDCluster-v0', "
                                                "cluster='tiny-2p2d', num_workflows=4)\n",
        "module syntax": "import gymnasium as gym\n"
                         "env = gym.make('hexagent_gym:hexagent_gym/PDCluster-v0', "
                         "cluster='tiny-2p2d', num_workflows=4)\n",
        "hexagent_gym.make": "import sys, hexagent_gym\n"
                             "assert 'gymnasium' not in sys.modules\n"
                             "env = hexagent_gym.make(cluster='tiny-2p2d', num_workflows=4)\n"
                             "import gymnasium as gym\n"
                             "assert 'hexagent_gym/PDCluster-v0' in gym.registry\n",
    }
    tail = ("obs, info = env.reset(seed=0)\n"
            "env.step(int(env.unwrapped.action_masks().argmax()))\n"
            "print(type(env.unwrapped).__name__)\n")
    for label, src in code.items():
        out = subprocess.run([sys.executable, "-c", src + tail], capture_output=True, text=True)
        assert out.returncode == 0, f"{label}: {out.stderr}"
        assert out.stdout.strip() == "PDClusterEnv", label


def test_the_core_loads_no_gymnasium_and_registers_once_gymnasium_is_imported():
    code = ("import sys, hexagent_gym\n"
            "assert 'gymnasium' not in sys.modules and 'hexagent_gym.envs' not in sys.modules\n"
            "import gymnasium as gym\n"
            "print(hexagent_gym.ENV_ID in gym.registry)\n"
            "print(any('OnGymnasiumImport' in type(f).__name__ for f in sys.meta_path))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]  # registered, and the hook removed itself


def test_importing_envs_registers_the_id_and_exports_lazily():
    code = ("import sys, hexagent_gym.envs, gymnasium as gym\n"
            "from hexagent_gym.envs import ENV_ID\n"
            "assert ENV_ID == 'hexagent_gym/PDCluster-v0' and ENV_ID in gym.registry\n"
            "assert 'hexagent_gym.envs.pd_cluster_env' not in sys.modules, 'loaded eagerly'\n"
            "from hexagent_gym.envs import make_env_fn, PDClusterEnv, RolloutResult\n"
            "env = make_env_fn(cluster='tiny-2p2d', num_workflows=4)()\n"
            "assert isinstance(env, PDClusterEnv)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr



def test_gymnasium_make_passes_config_and_applies_its_checkers():
    env = gym.make(ENV_ID, **TINY, reward="attainment", max_calls_per_decision=8)
    assert env.spec.id == ENV_ID
    inner = env.unwrapped
    assert isinstance(inner, PDClusterEnv) and inner.k == 8
    assert inner.options.reward == "attainment"
    obs, _ = env.reset(seed=0)
    env.step(int(inner.action_masks().argmax()))


def test_vector_envs():
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    thunks = [make_env_fn(rank=i, **TINY) for i in range(2)]
    pickle.dumps(thunks[0])
    vec = gym.vector.SyncVectorEnv(thunks)
    obs, info = vec.reset(seed=0)
    assert obs["delta"].shape == (2, 16, 2, 2)
    masks = vec.call("action_masks")
    actions = np.array([int(np.flatnonzero(m)[0]) for m in masks])
    obs, rew, term, trunc, info = vec.step(actions)
    assert rew.shape == (2,)
    vec.close()
    # unseeded sub-envs sample different episodes (rank offsets the config seed)
    dummy = DummyVecEnv(thunks)
    dummy.reset()
    seeds = dummy.get_attr("episode_seed")
    assert seeds[0] != seeds[1]
    masks = dummy.env_method("action_masks")
    dummy.step(np.array([int(np.flatnonzero(m)[0]) for m in masks]))
    dummy.close()
    sub = SubprocVecEnv(thunks)
    try:
        obs = sub.reset()
        assert obs["calls"].shape == (2, 16, len(CALL_FEATURES))
        masks = sub.env_method("action_masks")
        obs, rew, done, infos = sub.step(np.array([int(np.flatnonzero(m)[0]) for m in masks]))
        assert rew.shape == (2,)
    finally:
        sub.close()


def test_maskable_ppo_trains_and_rolls_out():
    import torch
    from sb3_contrib import MaskablePPO

    torch.set_num_threads(1)
    env = hexagent_gym.make(**TINY, max_calls_per_decision=8)
    model = MaskablePPO("MultiInputPolicy", env, n_steps=128, batch_size=64, n_epochs=2,
                        seed=0, device="cpu", policy_kwargs={"net_arch": [32]})
    model.learn(total_timesteps=256)
    assert model.num_timesteps >= 256
    result = env.rollout(model, seed=0)
    assert result.num_workflows == 8 and result.policy == "MaskablePPO"
    assert np.all(result.ratios >= 1.0 - 1e-9) and math.isfinite(result.total_reward)
    again = env.rollout(model, seed=0)
    np.testing.assert_array_equal(result.ratios, again.ratios)


def test_clip_bound_is_the_box_bound(env):
    for space in env.observation_space.spaces.values():
        assert np.all(space.high == CLIP)
