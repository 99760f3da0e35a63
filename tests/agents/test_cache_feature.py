"""The equivariant network's optional cache-affinity input (``cache_feature``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch as th

import hexagent_gym
from hexagent_gym.agents.learned import make_model
from hexagent_gym.agents.training import TrainConfig, TrainConfigError

th.set_num_threads(1)

# BFCL-v3 with the prefix cache on: later calls of a workflow find its prompt cached
CACHED = dict(cluster="hetero-1", trace="bfcl_v3", num_workflows=30, seed=1, load=1.5)


def _cached_obs(env):
    """A prefill-stage observation in which some call has a cache hit somewhere."""
    base = env.unwrapped
    obs, _ = env.reset(seed=0)
    while not obs["cached"].any():
        obs, _, done, _, _ = env.step(int(np.flatnonzero(base.action_masks())[0]))
        assert not done, "no cache hit in the episode"
    return obs


def _logits(policy, obs):
    t, _ = policy.obs_to_tensor(obs)
    with th.no_grad():
        return policy.action_logits(t)[0].numpy()


@pytest.fixture(scope="module")
def env():
    return hexagent_gym.make(**CACHED)


@pytest.mark.parametrize("on", [False, True])
def test_the_affinity_is_read_only_when_asked_for(env, on):
    th.manual_seed(0)
    model = make_model(env, "equivariant", policy_kwargs={"cache_feature": on} if on else None,
                       device="cpu", n_steps=64, batch_size=32)
    obs = _cached_obs(env)
    K, P, D = obs["delta"].shape
    k, p = map(int, np.argwhere(obs["cached"] > 0)[0])
    other = dict(obs, cached=np.zeros_like(obs["cached"]))
    a, b = _logits(model.policy, obs).reshape(K, P, D), _logits(model.policy, other).reshape(
        K, P, D)
    valid = obs["delta"] >= 0
    changed = ~np.isclose(a, b, rtol=0, atol=1e-7) & valid
    assert changed.any() == on
    if on:  # only the triples of calls and instances whose affinity changed move
        moved = {(int(x), int(y)) for x, y, _ in np.argwhere(changed)}
        assert (k, p) in moved
        assert moved <= {(int(x), int(y)) for x, y in np.argwhere(obs["cached"] > 0)}


def test_permuting_instances_permutes_logits_with_the_affinity(env):
    th.manual_seed(0)
    model = make_model(env, "equivariant", policy_kwargs={"cache_feature": True}, device="cpu",
                       n_steps=64, batch_size=32)
    obs = _cached_obs(env)
    K, P, D = obs["delta"].shape
    rng = np.random.default_rng(2)
    pp, dd = rng.permutation(P), rng.permutation(D)
    permuted = dict(obs, prefill=obs["prefill"][pp], decode=obs["decode"][dd],
                    delta=obs["delta"][:, pp][:, :, dd], cached=obs["cached"][:, pp])
    base = _logits(model.policy, obs).reshape(K, P, D)
    moved = _logits(model.policy, permuted).reshape(K, P, D)
    np.testing.assert_allclose(moved, base[:, pp][:, :, dd], rtol=1e-5, atol=1e-5)


def test_a_saved_model_keeps_the_option(tmp_path, env):
    from sb3_contrib import MaskablePPO

    model = make_model(env, "equivariant", policy_kwargs={"cache_feature": True}, device="cpu",
                       n_steps=64, batch_size=32)
    model.save(tmp_path / "m.zip")
    loaded = MaskablePPO.load(tmp_path / "m.zip", device="cpu")
    assert loaded.policy.net.cache_feature
    obs = _cached_obs(env)
    np.testing.assert_array_equal(_logits(loaded.policy, obs), _logits(model.policy, obs))


def test_config_checks_the_option():
    assert TrainConfig(cache_feature=True).cache_feature
    with pytest.raises(TrainConfigError, match="cache_feature is an input of the equivariant"):
        TrainConfig(cache_feature=True, policy="mlp")
    with pytest.raises(TrainConfigError, match="cache_feature must be True or False"):
        TrainConfig(cache_feature="yes")


def test_the_option_needs_the_cached_key(env):
    from gymnasium import spaces

    from hexagent_gym.agents.equivariant_policy import EquivariantPolicy

    space = spaces.Dict({k: v for k, v in env.observation_space.spaces.items() if k != "cached"})
    with pytest.raises(ValueError, match="cache_feature=True reads the observation's 'cached'"):
        EquivariantPolicy(space, env.action_space, lambda _: 1e-3, cache_feature=True)
    EquivariantPolicy(space, env.action_space, lambda _: 1e-3)  # without the option: fine
