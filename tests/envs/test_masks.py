"""Action masks wherever Gymnasium 1.x and sb3-contrib look for them: on the object
``gymnasium.make`` returns, through ``get_wrapper_attr`` under any wrapper stack, in
``info["action_mask"]``, from gymnasium vector envs (``call`` and the stacked infos, both
autoreset modes) and through sb3-contrib's helpers and ``MaskablePPO``."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import hexagent_gym
from hexagent_gym import ENV_ID
from hexagent_gym.envs.masks import ActionMasks
from hexagent_gym.envs.pd_cluster_env import PDClusterEnv, make_env_fn

TINY = dict(cluster="tiny-2p2d", trace="bfcl_v3", num_workflows=4, seed=3)


def first_valid(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def test_make_returns_an_object_with_action_masks():
    env = gym.make(ENV_ID, **TINY)
    assert isinstance(env, ActionMasks)  # outermost, above the checker and OrderEnforcing
    env.reset(seed=0)
    mask = env.action_masks()
    assert mask.dtype == bool and mask.shape == (env.action_space.n,) and mask.any()
    np.testing.assert_array_equal(mask, env.unwrapped.action_masks())
    mask[:] = False  # a copy: editing it leaves the env's mask alone
    assert env.action_masks().any()
    # with a TimeLimit from make it is still the outermost wrapper
    limited = gym.make(ENV_ID, max_episode_steps=3, **TINY)
    assert isinstance(limited, ActionMasks) and isinstance(limited.env, gym.wrappers.TimeLimit)
    # the spec records the wrapper, so make(env.spec) rebuilds the same stack
    again = gym.make(env.spec)
    assert isinstance(again, ActionMasks)
    again.reset(seed=0)
    np.testing.assert_array_equal(again.action_masks(), env.unwrapped.action_masks())


@pytest.mark.parametrize("base", ["make", "bare"])
def test_get_wrapper_attr_reaches_the_mask_under_any_stack(base):
    env = gym.make(ENV_ID, **TINY) if base == "make" else PDClusterEnv(**TINY)
    stack = gym.wrappers.RecordEpisodeStatistics(gym.wrappers.TimeLimit(env, 1000))
    stack.reset(seed=1)
    steps = 0
    while True:
        mask = stack.get_wrapper_attr("action_masks")()
        np.testing.assert_array_equal(mask, stack.unwrapped.action_masks())
        _, _, terminated, truncated, info = stack.step(first_valid(mask))
        steps += 1
        if terminated or truncated:
            break
    assert terminated and steps > 4 and info["episode"]["l"] == steps
    assert not stack.get_wrapper_attr("action_masks")().any()


def test_info_carries_a_fresh_mask_on_reset_and_every_step():
    env = gym.make(ENV_ID, **TINY)
    rng = np.random.default_rng(0)
    _, info = env.reset(seed=2)
    seen = []
    steps = 0
    while True:
        mask = info["action_mask"]
        assert mask.dtype == bool and mask.shape == (env.action_space.n,)
        np.testing.assert_array_equal(mask, env.action_masks())
        assert not any(np.shares_memory(mask, m) for m in seen)
        seen.append(mask)
        valid = np.flatnonzero(mask)
        _, _, terminated, _, info = env.step(int(valid[rng.integers(len(valid))]))
        steps += 1
        # editing the info's mask must not change the env's
        before = env.action_masks()
        info["action_mask"][:] = ~info["action_mask"]
        np.testing.assert_array_equal(env.action_masks(), before)
        info["action_mask"][:] = before
        if terminated:
            break
    assert steps > 4 and steps == env.unwrapped.simulator.decisions_made
    assert not info["action_mask"].any() and "req99" in info  # drained: nothing is valid
    # every earlier mask kept the value it had when it was handed out (none was reused)
    assert all(m.any() for m in seen)


def _run_vector(vec: gym.vector.VectorEnv, mode: AutoresetMode) -> int:
    """Step ``vec`` (2 sub-envs) with the first valid action of each row of the info's mask
    until both sub-envs ended an episode; return the steps taken."""
    n = vec.single_action_space.n
    try:
        _, info = vec.reset(seed=0)
        ended = np.zeros(vec.num_envs, dtype=bool)
        just_ended = np.zeros(vec.num_envs, dtype=bool)
        steps = 0
        while not ended.all():
            masks = info["action_mask"]
            assert masks.shape == (vec.num_envs, n) and masks.dtype == bool
            assert info["_action_mask"].all()  # every sub-env reported a mask
            called = vec.call("action_masks")
            np.testing.assert_array_equal(np.stack(called), masks)
            actions = np.zeros(vec.num_envs, dtype=np.int64)
            for i in range(vec.num_envs):
                if masks[i].any():
                    actions[i] = first_valid(masks[i])
                else:  # only NEXT_STEP shows the drained episode; its action is ignored
                    assert mode == AutoresetMode.NEXT_STEP and just_ended[i]
            _, _, term, trunc, info = vec.step(actions)
            steps += 1
            just_ended = term | trunc
            for i in np.flatnonzero(just_ended):
                ended[i] = True
                if mode == AutoresetMode.SAME_STEP:  # already the next episode's first step
                    assert info["action_mask"][i].any()
                else:
                    assert not info["action_mask"][i].any()
        return steps
    finally:
        vec.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_make_vec_masks_from_call_and_infos(vectorization, mode):
    vec = gym.make_vec(ENV_ID, num_envs=2, vectorization_mode=vectorization,
                       vector_kwargs={"autoreset_mode": mode}, **TINY)
    assert _run_vector(vec, mode) > 4


@pytest.mark.parametrize("vector_cls", [gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv])
def test_constructed_vector_envs_masks(vector_cls):
    thunks = [make_env_fn(rank=i, **TINY) for i in range(2)]
    vec = vector_cls(thunks, autoreset_mode=AutoresetMode.NEXT_STEP)
    assert _run_vector(vec, AutoresetMode.NEXT_STEP) > 4


def test_sb3_contrib_helpers_on_gym_make_envs():
    from sb3_contrib.common.maskable.utils import get_action_masks, is_masking_supported
    from stable_baselines3.common.vec_env import DummyVecEnv

    single = gym.make(ENV_ID, **TINY)
    assert is_masking_supported(single)
    single.reset(seed=0)
    np.testing.assert_array_equal(get_action_masks(single), single.unwrapped.action_masks())

    vec = DummyVecEnv([lambda: gym.make(ENV_ID, **TINY) for _ in range(2)])
    assert is_masking_supported(vec)
    vec.reset()
    masks = get_action_masks(vec)
    assert masks.shape == (2, vec.action_space.n) and masks.dtype == bool
    for i, env in enumerate(vec.envs):
        np.testing.assert_array_equal(masks[i], env.unwrapped.action_masks())
    vec.close()


class _CountMasked(gym.Wrapper):
    """Counts steps whose action the mask allowed (the env raises on any other)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.valid_steps = 0

    def step(self, action):
        if self.env.get_wrapper_attr("action_masks")()[int(action)]:
            self.valid_steps += 1
        return self.env.step(action)


def test_maskable_ppo_learns_on_gym_make_envs_without_invalid_actions():
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    wrapped = []

    def thunk():
        env = _CountMasked(gym.make(ENV_ID, **TINY))
        wrapped.append(env)
        return env

    vec = DummyVecEnv([thunk, thunk])
    model = MaskablePPO("MultiInputPolicy", vec, n_steps=64, batch_size=64, n_epochs=1,
                        seed=0, device="cpu")
    model.learn(total_timesteps=256)
    # an invalid action would have raised ValueError inside learn; every step was a valid one
    assert model.num_timesteps >= 256
    assert sum(env.valid_steps for env in wrapped) == model.num_timesteps
    vec.close()


def test_hexagent_make_is_unchanged():
    # the core's factory still returns the bare env (it has action_masks itself)
    env = hexagent_gym.make(**TINY)
    assert type(env) is PDClusterEnv
