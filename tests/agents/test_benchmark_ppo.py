"""PPO training throughput (hexagent_gym.agents.benchmark.bench_ppo): consistent fields on a tiny
setting (never a wall-clock threshold), and the equivariant policy's fast paths giving the numbers
of
the code they replace."""

from __future__ import annotations

import numpy as np
import pytest
import torch as th

import hexagent_gym
from hexagent_gym.agents.benchmark import PPO_LABELS, bench_ppo
from hexagent_gym.agents.equivariant_net import N_DELTA
from hexagent_gym.agents.learned import make_model

TINY = dict(cluster="tiny-2p2d", trace="bfcl_v3", num_workflows=8, load=1.5)


def test_bench_ppo_fields_are_consistent():
    threads = th.get_num_threads()
    bench = bench_ppo(**TINY, n_envs=2, n_steps=16, batch_size=16, n_epochs=1, timesteps=64,
                      repeat=1)
    assert th.get_num_threads() == threads  # restored
    assert tuple(r.label for r in bench.runs) == PPO_LABELS
    assert (bench.cluster, bench.num_workflows, bench.n_envs, bench.n_steps) == (
        "tiny-2p2d", 8, 2, 16)
    for r in bench.runs:
        assert r.timesteps == 64
        assert r.seconds > 0 and r.rollout_seconds > 0 and r.update_seconds > 0
        assert r.fps == pytest.approx(r.timesteps / r.seconds)
        assert r.rollout_seconds + r.update_seconds <= r.seconds
        assert r.other_seconds >= 0
    assert bench.ratio("cartpole") == 1.0
    assert bench.ratio("equivariant") == pytest.approx(
        bench.run("equivariant").fps / bench.run("cartpole").fps)


@pytest.fixture(scope="module")
def batch():
    """A model on a busy small episode and a batch of its observations and masks."""
    env = hexagent_gym.make(cluster="hetero-1", trace="lats", num_workflows=4, seed=1, load=2.0,
                            prefix_cache=False, parallel_sampling=False)
    th.manual_seed(0)
    model = make_model(env, "equivariant", policy_kwargs={"prior": 1.0}, device="cpu")
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    rows, masks = [], []
    for _ in range(24):
        mask = env.action_masks()
        rows.append(obs)
        masks.append(mask)
        obs, _, done, _, _ = env.step(int(rng.choice(np.flatnonzero(mask))))
        if done:
            obs, _ = env.reset()
    stacked = {k: np.stack([o[k] for o in rows]) for k in rows[0]}
    return model.policy, model.policy.obs_to_tensor(stacked)[0], np.stack(masks)


def test_valid_delta_features_are_the_grid_at_the_valid_triples(batch):
    policy, obs, _ = batch
    calls, delta = obs["calls"], obs["delta"]
    valid = delta >= 0.0
    grid, rel_grid = policy.net.delta_features(calls, delta, valid)
    feats, rel, index = policy.net.valid_delta_features(calls, delta, valid)
    assert feats.shape == (int(valid.sum()), N_DELTA)
    assert th.equal(feats, grid[index]) and th.equal(rel, rel_grid)


def test_forward_and_evaluate_actions_match_the_distribution(batch):
    """The policy's masked log-probabilities, sampling and entropy skip sb3-contrib's
    distribution objects; the numbers, the sampled actions and the gradients are the same."""
    policy, obs, masks = batch
    with th.no_grad():
        logits = policy.action_logits(obs)
        th.manual_seed(5)
        actions, values, log_prob = policy(obs, action_masks=masks)
        th.manual_seed(5)
        dist = policy._distribution(logits, masks)
        expected = dist.get_actions()
    assert th.equal(actions, expected) and not actions.is_inference()
    assert th.equal(log_prob, dist.log_prob(expected))
    assert th.equal(values, policy.predict_values(obs))
    greedy, _, _ = policy(obs, deterministic=True, action_masks=masks)
    assert th.equal(greedy, dist.get_actions(deterministic=True))

    t_masks = th.as_tensor(masks, dtype=th.float32)
    grads = []
    for fast in (True, False):
        policy.zero_grad()
        if fast:
            values, log_prob, entropy = policy.evaluate_actions(obs, expected, t_masks)
        else:  # evaluate_actions before the fast path: one forward, sb3-contrib's distribution
            logits, values = policy.net(obs)
            dist = policy._distribution(logits, t_masks)
            log_prob, entropy = dist.log_prob(expected), dist.entropy()
        (values.sum() + log_prob.sum() + entropy.sum()).backward()
        grads.append(([t.detach().clone() for t in (values, log_prob, entropy)],
                      [p.grad.clone() for p in policy.parameters() if p.grad is not None]))
    (out_a, grad_a), (out_b, grad_b) = grads
    assert all(th.equal(a, b) for a, b in zip(out_a, out_b, strict=True))
    assert len(grad_a) == len(grad_b) and all(
        th.equal(a, b) for a, b in zip(grad_a, grad_b, strict=True))
