"""hexagent_gym.agents.rllib_env: PDCluster-v0 in the Dict shape of RLlib's
ActionMaskingTorchRLModule, and one PPO iteration on RLlib's new API stack with it. The wrapper
tests need only gymnasium; the
training test is skipped without ray[rllib] (pip install "hexagent-gym[distributed]")."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hexagent_gym
from hexagent_gym.agents.rllib_env import (
    MASK_KEY,
    OBS_KEY,
    RLlibObservation,
    make_rllib_env,
    ppo_config,
)
from hexagent_gym.scripts.rllib_ppo import summary

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(cluster="tiny-2p2d", trace="bfcl_v3", num_workflows=6, seed=3,
            max_calls_per_decision=4)


def test_wrapper_obs_is_in_its_space_and_carries_the_envs_mask_and_features():
    env = make_rllib_env(TINY)
    raw = hexagent_gym.make(**TINY, action_mask_in_obs=True)  # the same episode, unwrapped
    space = env.observation_space
    n = env.action_space.n
    assert set(space.spaces) == {MASK_KEY, OBS_KEY}
    assert space[MASK_KEY].shape == (n,) and space[MASK_KEY].dtype == np.float32
    assert space[OBS_KEY].dtype == np.float32 and len(space[OBS_KEY].shape) == 1
    assert space[OBS_KEY].shape[0] == sum(
        int(np.prod(s.shape)) for k, s in raw.observation_space.spaces.items() if k != MASK_KEY)
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=5)
    raw_obs, _ = raw.reset(seed=5)
    steps = 0
    while True:
        assert space.contains(obs)
        np.testing.assert_array_equal(obs[MASK_KEY], env.unwrapped.action_masks()
                                      .astype(np.float32))
        for key in env.keys:
            np.testing.assert_array_equal(obs[OBS_KEY][env.slices[key]], raw_obs[key].ravel())
        valid = np.flatnonzero(obs[MASK_KEY])
        action = int(valid[rng.integers(len(valid))])
        obs, reward, terminated, truncated, info = env.step(action)
        raw_obs, raw_reward, *_ = raw.step(action)
        assert reward == raw_reward
        steps += 1
        if terminated:
            break
    assert steps > 10 and "req99" in info
    assert space.contains(obs) and not obs[MASK_KEY].any()  # the drained episode: no action


def test_wrapper_needs_the_mask_in_the_observation():
    with pytest.raises(ValueError, match="action_mask_in_obs=True"):
        RLlibObservation(hexagent_gym.make(**TINY))


def test_creator_offsets_the_seed_by_rllibs_worker_index():
    class Context(dict):  # RLlib's EnvContext: a dict with a worker_index attribute
        worker_index = 2

    first = make_rllib_env(TINY).reset()[1]["episode_seed"]
    other = make_rllib_env(Context(TINY)).reset()[1]["episode_seed"]
    assert other != first
    assert other == hexagent_gym.make(**{**TINY, "seed": 5}).reset()[1]["episode_seed"]


def test_importing_the_wrapper_does_not_import_ray():
    code = ("import sys, hexagent_gym.agents.rllib_env\n"
            "assert 'ray' not in sys.modules, 'ray imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.rllib")
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="warning")
    yield ray
    ray.shutdown()


def test_one_ppo_iteration_with_the_action_masking_rl_module(ray_local):
    config = ppo_config(TINY, train_batch_size=64, minibatch_size=32, num_epochs=1,
                          hidden=32, seed=0)
    algo = config.build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    # the env raises ValueError on an invalid action and RLlib re-raises it (sub-environment
    # restarts are off by default), so a finished iteration sampled only valid actions
    runners, learner = result["env_runners"], result["learners"]["default_policy"]
    assert result["training_iteration"] == 1
    assert runners["num_env_steps_sampled"] >= 64
    assert runners.get("num_env_step_failures_lifetime", 0) == 0
    # a tiny episode is ~60 picks: one ended, and its final info reached the metrics
    assert runners["num_episodes"] >= 1 and 0 < runners["req99"] < math.inf
    assert math.isfinite(runners["episode_return_mean"])
    assert learner["num_module_steps_trained"] > 0 and math.isfinite(learner["policy_loss"])
    line = summary(result)
    assert line.startswith("iter 1,") and "req99" in line
