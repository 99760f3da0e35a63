"""The env's ``cached`` observation key: per-(call, prefill instance) fraction of the prompt found
in that instance's prefix cache at the decision point."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import hexagent_gym
from hexagent_gym.agents.hexagent import HexAgentPolicy
from hexagent_gym.agents.learned import LearnedPolicy
from hexagent_gym.envs.encoding import CLIP
from hexagent_gym.planning.decisions import Stage

TINY = dict(cluster="tiny-2p2d", trace="bfcl_v3", num_workflows=8, seed=3)


def expected(dp, k: int, p_max: int) -> np.ndarray:
    out = np.zeros((k, p_max), dtype=np.float32)
    if dp.stage == Stage.PREFILL:
        n, P = len(dp.calls), dp.num_prefill
        out[:n, :P] = dp.cached / np.array([c.l_in for c in dp.calls])[:, None]
    return out


def walk(env, seed: int = 0):
    """Step an episode with HexAgent's picks; yield (obs, decision point) at every step."""
    obs, _ = env.reset(seed=seed)
    teacher = HexAgentPolicy()
    teacher.reset(env.simulator)
    while True:
        dp = env.decision_point
        yield obs, dp
        action = env.encode_action(*teacher.pick(dp))
        obs, _, terminated, _, _ = env.step(action)
        if terminated:
            yield obs, None
            return


def test_the_space_has_a_cached_box_per_call_and_prefill_slot():
    env = hexagent_gym.make(**TINY, p_max=3)
    space = env.observation_space["cached"]
    assert space.shape == (16, 3) and space.dtype == np.float32
    assert np.all(space.low == 0.0) and np.all(space.high == CLIP)


@pytest.mark.parametrize("p_max", [None, 3])
def test_cached_is_the_hit_fraction_of_the_decision(p_max):
    env = hexagent_gym.make(**TINY, p_max=p_max)
    k, pm = env.k, env.p_max
    hits = decode_steps = 0
    for obs, dp in walk(env):
        assert env.observation_space.contains(obs)
        cached = obs["cached"]
        if dp is None:  # drained: the empty observation
            assert np.all(cached == 0.0)
            continue
        np.testing.assert_allclose(cached, expected(dp, k, pm), rtol=1e-6, atol=1e-7)
        assert np.all((cached >= 0.0) & (cached <= 1.0))
        assert np.all(cached[len(dp.calls):] == 0.0) and np.all(cached[:, 2:] == 0.0)
        if dp.stage == Stage.DECODE:
            decode_steps += 1
            assert np.all(cached == 0.0)
        hits += bool(cached.any())
    assert hits > 0 and decode_steps > 0  # the episode exercised both cases


def test_a_hit_shows_on_the_instance_that_holds_the_prefix():
    env = hexagent_gym.make(**TINY)
    for obs, dp in walk(env):
        if dp is not None and dp.stage == Stage.PREFILL and dp.cached.any():
            slot, p = np.argwhere(dp.cached > 0)[0]
            call = dp.calls[slot]
            assert obs["cached"][slot, p] == pytest.approx(dp.cached[slot, p] / call.l_in)
            assert 0.0 < obs["cached"][slot, p] <= 1.0
            # the hit is what makes that instance's prefill estimate cheaper
            assert call.pf_est[p] < call.pf_cold[p]
            return
    pytest.fail("no decision point with a prefix-cache hit in this episode")


def test_observations_do_not_share_the_cached_array():
    env = hexagent_gym.make(**TINY)
    prev = None
    for obs, _ in walk(env):
        if prev is not None:
            assert not np.shares_memory(obs["cached"], prev["cached"])
        prev = obs


def test_cached_is_zero_with_the_prefix_cache_off():
    env = hexagent_gym.make(**TINY, prefix_cache=False)
    for obs, _ in walk(env):
        assert np.all(obs["cached"] == 0.0)


def test_checkers_pass_with_the_new_key():
    from gymnasium.utils.env_checker import check_env as gym_check
    from stable_baselines3.common.env_checker import check_env as sb3_check

    env = hexagent_gym.make(**TINY)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gym_check(env, skip_render_check=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sb3_check(hexagent_gym.make(**TINY), warn=True)
    for w in caught:  # only the remarks about structured float boxes (see test_env.py)
        msg = str(w.message)
        assert "image" in msg or "unconventional shape" in msg, msg


def test_the_shipped_model_ignores_the_key_it_was_not_trained_on():
    learned = LearnedPolicy()
    assert "cached" not in learned.keys
    env = hexagent_gym.make(**TINY)
    obs, _ = env.reset(seed=0)
    assert set(learned.known(obs)) == set(learned.keys)
    action, _ = learned.predict(obs, action_masks=env.action_masks())
    assert env.action_masks()[int(np.asarray(action).reshape(-1)[0])]
    by_name = env.rollout("learned", seed=0)
    through_env = env.rollout(learned.model, seed=0)  # the raw model sees the extra key too
    assert by_name.num_workflows == through_env.num_workflows == 8
    np.testing.assert_allclose(by_name.ratios, through_env.ratios)
