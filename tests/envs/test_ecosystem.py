"""PDClusterEnv in other frameworks' shapes: the mask inside the observation, vector envs under
both autoreset modes, per-step info, RecordEpisodeStatistics and the ansi render."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import hexagent_gym
from hexagent_gym.envs.pd_cluster_env import make_env_fn
from hexagent_gym.envs.render import STEP_INFO_KEYS
from hexagent_gym.planning.decisions import Stage

TINY = dict(cluster="tiny-2p2d", trace="bfcl_v3", num_workflows=6, seed=3)


def first_valid(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def test_mask_in_obs_equals_action_masks_at_every_step():
    env = hexagent_gym.make(**TINY, action_mask_in_obs=True).unwrapped
    space = env.observation_space["action_mask"]
    assert isinstance(space, gym.spaces.MultiBinary) and space.n == env.action_space.n
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=1)
    steps = 0
    while True:
        assert env.observation_space.contains(obs)
        np.testing.assert_array_equal(obs["action_mask"].astype(bool), env.action_masks())
        valid = np.flatnonzero(obs["action_mask"])
        obs, _, terminated, _, _ = env.step(int(valid[rng.integers(len(valid))]))
        steps += 1
        if terminated:
            break
    assert steps > 10
    assert not obs["action_mask"].any() and not env.action_masks().any()


def test_mask_in_obs_leaves_the_other_keys_and_the_episode_unchanged():
    on = hexagent_gym.make(**TINY, action_mask_in_obs=True).unwrapped
    off = hexagent_gym.make(**TINY).unwrapped
    assert set(on.observation_space.spaces) - set(off.observation_space.spaces) == {"action_mask"}
    a, _ = on.reset(seed=4)
    b, _ = off.reset(seed=4)
    while True:
        for key in b:
            np.testing.assert_array_equal(a[key], b[key])
        act = first_valid(off.action_masks())
        a, ra, done, _, _ = on.step(act)
        b, rb, _, _, _ = off.step(act)
        assert ra == rb
        if done:
            break


@pytest.mark.parametrize("mask_in_obs", [False, True])
def test_both_checkers_pass_with_mask_in_obs_on_and_off(mask_in_obs):
    from gymnasium.utils.env_checker import check_env as gym_check
    from stable_baselines3.common.env_checker import check_env as sb3_check

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # through gym.make: the checker needs the spec to test the other render modes
        gym_check(gym.make(hexagent_gym.ENV_ID, **TINY, action_mask_in_obs=mask_in_obs,
                           render_mode="ansi").unwrapped)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sb3_check(hexagent_gym.make(**TINY, action_mask_in_obs=mask_in_obs), warn=True)
    for w in caught:  # only the remarks about structured float boxes (see test_env.py)
        msg = str(w.message)
        assert "image" in msg or "unconventional shape" in msg, msg


def run_vector(mode: AutoresetMode, vector_cls=gym.vector.SyncVectorEnv, episodes: int = 1):
    """Step a 2-env vector env with masks from the observation until each sub-env finished
    ``episodes`` episodes; returns (steps, finished episodes, masks seen at ended steps)."""
    thunks = [make_env_fn(rank=i, **TINY, action_mask_in_obs=True) for i in range(2)]
    vec = vector_cls(thunks, autoreset_mode=mode)
    try:
        obs, _ = vec.reset(seed=0)
        done = np.zeros(2, dtype=int)
        ended_masks = []
        just_ended = np.zeros(2, dtype=bool)
        steps = 0
        while done.min() < episodes:
            masks = obs["action_mask"]
            actions = np.zeros(2, dtype=np.int64)
            for i in range(2):
                if masks[i].any():
                    actions[i] = first_valid(masks[i])
                else:
                    # only NEXT_STEP shows an ended episode's empty mask; its action is ignored
                    assert mode == AutoresetMode.NEXT_STEP and just_ended[i]
            obs, _, term, trunc, info = vec.step(actions)
            steps += 1
            assert set(STEP_INFO_KEYS) <= set(info)
            just_ended = term | trunc
            for i in np.flatnonzero(just_ended):
                done[i] += 1
                if mode == AutoresetMode.SAME_STEP:
                    ended_masks.append(info["final_obs"][i]["action_mask"])
                    assert obs["action_mask"][i].any()  # already the next episode's first step
                else:
                    ended_masks.append(obs["action_mask"][i].copy())
        return steps, done, ended_masks
    finally:
        vec.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_sync_vector_env_runs_whole_episodes_with_masks(mode):
    steps, done, ended = run_vector(mode)
    assert done.min() >= 1 and steps > 10
    assert ended and all(not m.any() for m in ended)  # a drained episode has no valid action


def test_async_vector_env_steps_with_masks():
    steps, done, _ = run_vector(AutoresetMode.SAME_STEP, gym.vector.AsyncVectorEnv)
    assert done.min() >= 1


def test_sb3_subproc_vec_env_masks_follow_autoreset():
    from sb3_contrib.common.maskable.utils import get_action_masks
    from stable_baselines3.common.vec_env import SubprocVecEnv

    vec = SubprocVecEnv([make_env_fn(rank=i, **TINY) for i in range(2)])
    try:
        vec.reset()
        finished = 0
        for _ in range(400):
            masks = get_action_masks(vec)
            assert masks.shape == (2, vec.action_space.n) and masks.any(axis=1).all()
            _, _, dones, infos = vec.step(np.array([first_valid(m) for m in masks]))
            finished += int(dones.sum())
            for i in np.flatnonzero(dones):
                assert "terminal_observation" in infos[i] and "req99" in infos[i]
            if finished >= 2:
                break
        assert finished >= 2
    finally:
        vec.close()


def test_step_info_tracks_the_simulator():
    env = hexagent_gym.make(**TINY).unwrapped
    _, info = env.reset(seed=2)
    assert set(info) == set(STEP_INFO_KEYS) | {"episode_seed"}
    last_t, last_done = 0.0, 0
    while True:
        _, _, terminated, _, info = env.step(first_valid(env.action_masks()))
        sim = env.simulator
        assert info["sim_time"] == sim.now >= last_t
        assert info["workflows_finished"] == len(sim.finished) >= last_done
        assert info["waiting_prefill"] == sim.num_waiting(Stage.PREFILL)
        assert info["waiting_decode"] == sim.num_waiting(Stage.DECODE)
        assert info["running_prefill"] == sum(p.running is not None for p in sim.prefill)
        assert info["running_decode"] == sum(len(d.batch) for d in sim.decode)
        assert info["workflows_arrived"] >= info["workflows_finished"]
        last_t, last_done = info["sim_time"], info["workflows_finished"]
        if terminated:
            break
    assert info["workflows_finished"] == info["num_workflows"] == 6
    assert info["running_prefill"] == info["running_decode"] == 0


def test_record_episode_statistics_reports_the_episode():
    from gymnasium.wrappers import RecordEpisodeStatistics

    env = RecordEpisodeStatistics(hexagent_gym.make(**TINY))
    env.reset(seed=5)
    steps, total = 0, 0.0
    while True:
        _, reward, terminated, _, info = env.step(first_valid(env.unwrapped.action_masks()))
        steps += 1
        total += reward
        if terminated:
            break
    assert info["episode"]["l"] == steps
    assert info["episode"]["r"] == pytest.approx(total) == pytest.approx(info["episode_return"])


def test_ansi_render_shows_window_and_every_instance():
    env = hexagent_gym.make(**TINY, render_mode="ansi").unwrapped
    assert hexagent_gym.make(**TINY).unwrapped.render() is None
    assert "reset()" in env.render()
    env.reset(seed=1)
    text = env.render()
    dp = env.decision_point
    assert f"{len(dp.calls)} calls, 0 picked" in text
    assert all(f"P{i} " in text for i in range(2)) and all(f"D{i} " in text for i in range(2))
    assert len(text.splitlines()) <= 40  # one screen
    env.step(first_valid(env.action_masks()))
    if env.decision_point is dp:
        assert "1 picked" in env.render() and "picked\n" in env.render()
    while env.decision_point is not None:
        env.step(first_valid(env.action_masks()))
    assert "episode drained" in env.render()
