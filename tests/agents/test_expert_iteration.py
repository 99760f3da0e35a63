"""Expert iteration: the rollout-search teacher, teacher caches and training on a mixture."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch as th

from hexagent_gym.agents.hexagent import HexAgentPolicy
from hexagent_gym.agents.imitation import collect_demonstrations
from hexagent_gym.agents.search import HexAgentSearch
from hexagent_gym.agents.training import TrainConfig, train
from hexagent_gym.agents.training.warmstart import teacher_episodes
from hexagent_gym.envs.mixture import MixtureEnv
from hexagent_gym.envs.pd_cluster_env import PDClusterEnv

th.set_num_threads(1)

TINY_MIX = {
    "name": "tiny-mix",
    "episode": {"num_workflows": 5, "max_calls_per_decision": 4},
    "settings": [{"cluster": "tiny-2p2d", "trace": "bfcl_v3", "load": 3.0}],
    "generated": {"count": 2, "seed": 1, "load": [2.0, 4.0],
                  "clusters": {"gpus": ["a100", "h200"], "prefill": [1, 2], "decode": [1, 2]}},
}


def _same(a, b) -> bool:
    return (a.obs.keys() == b.obs.keys() and all(np.array_equal(a.obs[k], b.obs[k]) for k in a.obs)
            and np.array_equal(a.actions, b.actions) and np.array_equal(a.targets, b.targets)
            and np.array_equal(a.returns, b.returns) and a.episodes == b.episodes)


def test_search_with_one_candidate_labels_as_hexagent():
    env = MixtureEnv(TINY_MIX)
    a = collect_demonstrations(env, range(3), teacher=HexAgentPolicy())
    b = collect_demonstrations(env, range(3), teacher=HexAgentSearch(k=1))
    assert _same(a, b)


def test_search_labels_states_with_its_own_picks():
    """Every label is the search's pick at that state (collected through the env)."""
    env = PDClusterEnv(None, cluster="tiny-2p2d", trace="bfcl_v3", num_workflows=6, load=3.0,
                       max_calls_per_decision=4)
    teacher = HexAgentSearch(k=3)
    demos = collect_demonstrations(env, [0], teacher=teacher)
    assert teacher.rollouts > 0
    obs, _ = env.reset(seed=0)
    mirror = HexAgentSearch(k=3)
    mirror.reset(env.simulator)
    for label in demos.actions:
        assert env.encode_action(*mirror.pick(env.decision_point)) == label
        env.step(int(label))


def test_teacher_episodes_cache_round_trips_and_refuses_other_teachers(tmp_path):
    env = MixtureEnv(TINY_MIX)
    cache = tmp_path / "demos.npz"
    demos, held = teacher_episodes(env, HexAgentPolicy(), 2, 0.99, cache)
    assert cache.exists()
    again, held_again = teacher_episodes(env, HexAgentPolicy(), 2, 0.99, cache)
    assert _same(demos, again) and _same(held, held_again)
    fresh, _ = teacher_episodes(env, HexAgentPolicy(), 2, 0.99)
    assert _same(demos, fresh)  # the file holds what collecting again gives
    with pytest.raises(ValueError, match="collected with .*HexAgentPolicy.*not .*HexAgentSearch"):
        teacher_episodes(env, HexAgentSearch(k=2), 2, 0.99, cache)
    with pytest.raises(ValueError, match="pass another demos path"):
        teacher_episodes(env, HexAgentPolicy(), 3, 0.99, cache)


def test_training_on_a_mixture_with_the_search_teacher(tmp_path):
    mix = tmp_path / "mix.yaml"
    mix.write_text(json.dumps(TINY_MIX))  # JSON is YAML
    config = TrainConfig(mixture=mix, init_from="hexagent-search", demos=tmp_path / "d.npz",
                         bc_episodes=2, bc_epochs=1, dagger_rounds=1, dagger_episodes=1,
                         total_timesteps=0, cluster="tiny-2p2d", num_workflows=5, load=3.0,
                         n_envs=2, n_steps=16, batch_size=16, eval_seeds=(1,),
                         cache_feature=True, logdir=tmp_path / "run", verbose=0)
    result = train(config)
    record = json.loads(result.run_record.read_text())
    assert record["args"]["mixture"] == str(mix)
    assert record["args"]["init_from"] == "hexagent-search"
    assert result.bc["samples"] > 0 and (tmp_path / "d.npz").exists()
    assert record["args"]["cache_feature"] is True
    # the saved model schedules a cluster of another size than any it was trained on
    other = PDClusterEnv(None, cluster="hetero-1", trace="bfcl_v3", num_workflows=5, load=1.0)
    assert len(other.rollout(result.model_path, seed=0).ratios) == 5


def test_relative_reward_on_a_mixture_pays_hexagent_nothing():
    """The reward relative to HexAgent replays each episode's own setting: HexAgent earns 0."""
    from hexagent_gym.agents.shaping import ReferenceRelativeReward

    env = ReferenceRelativeReward(MixtureEnv(TINY_MIX))
    settings = set()
    for seed in range(4):
        _, info = env.reset(seed=seed)
        settings.add(info["setting"])
        policy = HexAgentPolicy()
        policy.reset(env.unwrapped.simulator)
        done = False
        while not done:
            pick = policy.pick(env.unwrapped.decision_point)
            _, _, done, _, info = env.step(env.unwrapped.encode_action(*pick))
        assert info["relative_return"] == 0.0 and info["reference_req99"] == info["req99"]
    assert len(settings) >= 2
