"""hexagent_gym.agents.rllib_env: PDCluster-v0 in the Dict shape of our action-masking
RLModule (hexagent_gym.agents.rllib_module, on RLlib's public DefaultPPOTorchRLModule), PPO
iterations on RLlib's new API stack with it, and scripts/rllib_ppo.py's TensorBoard output. The
wrapper tests need only gymnasium; the RLlib tests are skipped without ray[rllib]
(pip install "hexagent-gym[distributed]")."""

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
    result_scalars,
    result_step,
)
from hexagent_gym.scripts import rllib_ppo
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


def test_result_scalars_pick_finite_values_by_path():
    result = {"env_runners": {"episode_return_mean": -1.5, "req99": 2.25, "req95": math.nan,
                              "num_env_steps_sampled_lifetime": 128},
              "learners": {"default_policy": {"policy_loss": 0.5, "vf_loss": None}}}
    assert result_scalars(result) == {"charts/episode_return_mean": -1.5,
                                      "charts/req99": 2.25, "losses/policy_loss": 0.5}
    assert result_step(result) == 128 and result_step({}) == 0


def test_importing_our_rl_module_logs_no_deprecation():
    # RLlib's example masking module imports the deprecated PPOTorchRLModule alias, which logs
    # "DeprecationWarning: ..." through ray's logger (stderr), not through `warnings`
    pytest.importorskip("ray.rllib")
    code = ("import warnings\n"
            "warnings.simplefilter('always')\n"
            "with warnings.catch_warnings(record=True) as rec:\n"
            "    warnings.simplefilter('always')\n"
            "    from hexagent_gym.agents.rllib_env import ppo_config\n"
            "    spec = ppo_config({'cluster': 'tiny-2p2d'}).rl_module_spec\n"
            "print(spec.module_class.__module__)\n"
            "for w in rec:\n"
            "    if issubclass(w.category, DeprecationWarning) and ('rllib' in w.filename\n"
            "            or 'hexagent' in w.filename or 'rllib' in str(w.message)):\n"
            "        print('WARNED', w.filename, w.message)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "hexagent_gym.agents.rllib_module"
    assert "WARNED" not in proc.stdout
    assert "DeprecationWarning" not in proc.stderr and "deprecated" not in proc.stderr


def test_rl_module_gives_masked_actions_no_probability():
    pytest.importorskip("ray.rllib")
    import gymnasium as gym
    import torch
    from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import (
        DefaultPPOTorchRLModule,
    )
    from ray.rllib.core.columns import Columns
    from ray.rllib.utils.torch_utils import FLOAT_MIN

    from hexagent_gym.agents import rllib_module
    from hexagent_gym.agents.rllib_module import MaskedPPOTorchRLModule

    assert (rllib_module.MASK_KEY, rllib_module.OBS_KEY) == (MASK_KEY, OBS_KEY)
    n, f = 6, 5
    space = gym.spaces.Dict({MASK_KEY: gym.spaces.Box(0.0, 1.0, (n,), np.float32),
                             OBS_KEY: gym.spaces.Box(-1.0, 1.0, (f,), np.float32)})
    module = MaskedPPOTorchRLModule(observation_space=space, action_space=gym.spaces.Discrete(n),
                                    model_config={"fcnet_hiddens": [8],
                                                  "head_fcnet_hiddens": [8]})
    assert module.observation_space == space  # the full space again after setup
    torch.manual_seed(0)
    feats = torch.randn(4, f)
    mask = torch.tensor([[1, 0, 1, 0, 0, 1], [0, 0, 0, 0, 0, 1], [1, 1, 1, 1, 1, 1],
                         [0, 0, 0, 0, 0, 0]], dtype=torch.float32)
    obs = {MASK_KEY: mask, OBS_KEY: feats}
    batch = {Columns.OBS: obs}
    with torch.no_grad():
        plain = DefaultPPOTorchRLModule._forward(module, {Columns.OBS: feats})
        outs = [module.forward_inference(batch), module.forward_exploration(batch),
                module.forward_train(batch)]
        values = module.compute_values(batch)
    assert batch[Columns.OBS] is obs and set(obs) == {MASK_KEY, OBS_KEY}  # left as it was
    expected = torch.where(mask > 0, plain[Columns.ACTION_DIST_INPUTS], FLOAT_MIN)
    for out in outs:
        logits = out[Columns.ACTION_DIST_INPUTS]
        assert torch.equal(logits, expected)
        probs = torch.softmax(logits, dim=1)
        assert (probs[mask == 0][:-n] == 0).all()  # every masked action of rows 0-2
        assert probs[1, 5] == 1.0  # the only valid action is certain
        assert torch.isfinite(probs).all()  # row 3 (nothing valid) stays a distribution
    assert values.shape == (4,) and torch.isfinite(values).all()
    with pytest.raises(ValueError, match="action_mask"):
        module.forward_inference({Columns.OBS: feats})  # never runs unmasked
    with pytest.raises(ValueError, match="Dict observation space"):
        MaskedPPOTorchRLModule(observation_space=space[OBS_KEY],
                               action_space=gym.spaces.Discrete(n))


def test_script_writes_tensorboard_scalars_at_env_steps(ray_local, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = rllib_ppo.parse_args([
        "--cluster", "tiny-2p2d", "--num-workflows", "4", "--max-calls-per-decision", "4",
        "--iterations", "2", "--train-batch-size", "64", "--minibatch-size", "32",
        "--num-epochs", "1", "--hidden", "16", "--logdir", str(tmp_path)])
    out = rllib_ppo.train(args)
    assert ray_local.is_initialized()  # the script leaves a Ray it did not start running
    results = out["results"]
    assert len(results) == 2
    run_dir = Path(out["run_dir"])
    assert run_dir.parent == tmp_path and list(run_dir.glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"charts/episode_return_mean", "charts/req99", "losses/policy_loss"} <= tags
    steps = [result_step(r) for r in results]
    assert 64 <= steps[0] < steps[1]  # env steps sampled so far, not the iteration number
    for tag in ("charts/req99", "losses/policy_loss"):
        events = acc.Scalars(tag)
        assert [e.step for e in events] == [s for s, r in zip(steps, results, strict=True)
                                            if tag in result_scalars(r)]
        assert [e.value for e in events] == pytest.approx(
            [result_scalars(r)[tag] for r in results if tag in result_scalars(r)])
    assert all(0 < e.value < math.inf for e in acc.Scalars("charts/req99"))


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
