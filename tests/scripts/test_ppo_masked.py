"""scripts/ppo_masked.py (CleanRL-style masked PPO): a tiny run updates, logs to TensorBoard,
only ever sends valid actions (the env raises ValueError on an invalid one, so finishing the
run proves it), handles SAME_STEP episode ends, and is reproducible from its seed."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hexagent_gym.scripts import ppo_masked

TINY = dict(cluster="tiny-2p2d", trace="bfcl_v3", num_workflows=6, max_calls_per_decision=4,
            seed=3, num_envs=2, num_steps=32, total_timesteps=128, num_minibatches=2,
            update_epochs=2, hidden=32, torch_threads=1, eval_seeds="0")


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _events(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    """(step, value) of every scalar event, by tag."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run_dir)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _scalars(run_dir: str) -> dict[str, list[float]]:
    return {tag: [v for _, v in events] for tag, events in _events(run_dir).items()}


def test_tiny_run_updates_logs_and_evaluates(tmp_path):
    out = ppo_masked.train(ppo_masked.Args(**TINY, logdir=str(tmp_path)))
    assert out["updates"] == 2 and out["global_step"] == 128  # 2 envs x 32 steps x 2 updates
    # a tiny episode is ~60 picks, so both sub-envs finished one: SAME_STEP resets ran
    assert len(out["episode_req99"]) >= 2
    assert all(0 < r < math.inf for r in out["episode_req99"] + out["eval_req99"])
    assert len(out["hexagent_req99"]) == 1
    scalars = _scalars(out["run_dir"])
    for tag in ("charts/req99", "charts/episodic_return", "charts/episodic_length",
                "charts/SPS", "losses/policy_loss", "losses/value_loss", "losses/entropy",
                "losses/approx_kl", "eval/req99", "eval/hexagent_req99"):
        assert tag in scalars, f"{tag} missing from {sorted(scalars)}"
    assert len(scalars["losses/policy_loss"]) == 2  # one point per update
    assert scalars["charts/req99"] == pytest.approx(out["episode_req99"])
    events = _events(out["run_dir"])
    # every scalar's x is the global env step: updates at 64 and 128 env steps (2 envs x 32)
    assert [step for step, _ in events["losses/policy_loss"]] == [64, 128]
    # the evaluation sits at the env steps taken (128), not at the eval seed (0)
    assert events["eval/req99"] == [(128, pytest.approx(out["eval_req99"][0]))]
    assert events["eval/hexagent_req99"] == [(128, pytest.approx(out["hexagent_req99"][0]))]
    assert all(0 < step <= 128 for step, _ in events["charts/req99"])


def test_eval_over_several_seeds_is_one_mean_point_at_the_global_step(tmp_path):
    out = ppo_masked.train(ppo_masked.Args(**{**TINY, "eval_seeds": "1,4", "total_timesteps": 64},
                                           logdir=str(tmp_path)))
    assert out["global_step"] == 64 and len(out["eval_req99"]) == 2
    events = _events(out["run_dir"])
    assert events["eval/req99"] == [(64, pytest.approx(sum(out["eval_req99"]) / 2))]
    assert events["eval/hexagent_req99"] == [(64, pytest.approx(sum(out["hexagent_req99"]) / 2))]


def test_same_seed_same_run(tmp_path):
    a = ppo_masked.train(ppo_masked.Args(**TINY, logdir=str(tmp_path / "a")))
    b = ppo_masked.train(ppo_masked.Args(**TINY, logdir=str(tmp_path / "b")))
    assert a["episode_req99"] == b["episode_req99"] and a["eval_req99"] == b["eval_req99"]


def test_truncated_episodes_bootstrap_from_final_obs(tmp_path):
    # max_steps cuts every episode after 10 picks: the run reads info["final_obs"] for the
    # bootstrap value and info["final_info"] for the truncated episodes' statistics
    out = ppo_masked.train(ppo_masked.Args(**{**TINY, "eval_seeds": ""}, max_steps=10,
                                           logdir=str(tmp_path)))
    # each sub-env takes 64 steps: 6 episodes cut at 10 picks (a tiny episode needs ~60)
    assert out["updates"] == 2 and len(out["episode_req99"]) == 2 * 6
    assert set(_scalars(out["run_dir"])["charts/episodic_length"]) == {10}


def test_masked_policy_gives_invalid_actions_no_probability():
    torch.manual_seed(0)
    agent = ppo_masked.Agent(obs_dim=5, num_actions=8, hidden=16, keys=("x",))
    mask = torch.rand(64, 8) < 0.3
    mask[:, 0] = True  # every row has a valid action
    x = torch.randn(64, 5)
    action, logprob, entropy, value = agent.get_action_and_value(x, mask)
    assert mask[torch.arange(64), action].all()
    assert torch.isfinite(logprob).all() and torch.isfinite(entropy).all()
    logits = agent.masked_logits(x, mask)
    probs = torch.softmax(logits, dim=1)
    assert (probs[~mask] == 0).all()
    # one valid action: entropy 0 and that action is certain; the greedy predict picks it
    only = torch.zeros(1, 8, dtype=torch.bool)
    only[0, 5] = True
    _, lp, ent, _ = agent.get_action_and_value(x[:1], only)
    assert lp.item() == pytest.approx(0.0) and ent.item() == pytest.approx(0.0, abs=1e-6)
    obs = {"x": x[0].numpy(), "action_mask": only[0].numpy().astype(np.int8)}
    assert agent.predict(obs)[0] == 5


def test_too_few_timesteps_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="nothing to train"):
        ppo_masked.train(ppo_masked.Args(**{**TINY, "total_timesteps": 10},
                                         logdir=str(tmp_path)))
