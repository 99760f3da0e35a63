"""hexagent_gym.envs.mixture: training on a distribution of (cluster, trace, load) settings."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from hexagent_gym.agents.hexagent import HexAgentPolicy
from hexagent_gym.config import ConfigError
from hexagent_gym.envs.mixture import MixtureEnv, load_mixture, make_mixture_fn

TINY_MIX = {
    "name": "tiny-mix",
    "episode": {"num_workflows": 4, "max_calls_per_decision": 4},
    "settings": [{"cluster": "tiny-2p2d", "trace": "bfcl_v3", "load": 1.5}],
    "generated": {"count": 3, "seed": 0, "traces": ["bfcl_v3", "sharegpt"], "load": [1.0, 2.0],
                  "clusters": {"gpus": ["h100", "h200"], "prefill": [1, 3], "decode": [1, 3]}},
}


@pytest.fixture(scope="module")
def env():
    return MixtureEnv(TINY_MIX)


def test_settings_are_the_fixed_ones_then_the_generated_pool(env):
    assert len(env.settings) == 4
    first = env.settings[0]
    assert first == {"num_workflows": 4, "max_calls_per_decision": 4, "cluster": "tiny-2p2d",
                     "trace": "bfcl_v3", "load": 1.5}
    for s in env.settings[1:]:
        assert s["cluster"].startswith("gen-") and s["trace"] in ("bfcl_v3", "sharegpt")
        assert 1.0 <= s["load"] <= 2.0 and s["arrival_rate"] is None
    assert load_mixture(TINY_MIX)[1] == env.settings  # the pool is fixed by its seed


def test_spaces_are_padded_to_the_largest_setting(env):
    P = max(len(e.factory.cluster.prefill) for e in env.envs)
    D = max(len(e.factory.cluster.decode) for e in env.envs)
    assert env.observation_space["delta"].shape == (4, P, D)
    assert all(e.observation_space == env.observation_space for e in env.envs)
    for seed in range(6):
        obs, info = env.reset(seed=seed)
        assert env.observation_space.contains(obs)
        p = len(env.envs[info["setting"]].factory.cluster.prefill)
        mask = env.action_masks().reshape(4, P, D)
        assert mask.any() and not mask[:, p:, :].any()  # padded prefill slots are invalid


def test_a_reset_seed_fixes_the_setting_and_the_episode(env):
    drawn = {env.reset(seed=s)[1]["setting"] for s in range(12)}
    assert len(drawn) >= 3  # seeds spread over the settings
    a, info_a = env.reset(seed=5)
    b, info_b = env.reset(seed=5)
    assert info_a.keys() == info_b.keys()  # key by key: the info's action_mask is an array
    assert all(np.array_equal(info_a[k], info_b[k]) for k in info_a)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert env.draw(5)[0] == info_a["setting"]


def test_rollout_serves_the_episode_reset_draws(env):
    for seed in (1, 2):
        obs, info = env.reset(seed=seed)
        policy = HexAgentPolicy()
        policy.reset(env.simulator)
        done = False
        while not done:
            slot, p, d = policy.pick(env.decision_point)
            obs, _, done, _, info = env.step(env.encode_action(slot, p, d))
        result = env.rollout("hexagent", seed=seed)
        assert result.req99 == info["req99"]
        assert float(np.mean(result.ratios)) == info["mean_ratio"]
        assert result.episode_seed == info["episode_seed"]
        assert info["setting"] == env.index


def test_the_thunk_pickles_and_builds_the_same_mixture():
    fn = pickle.loads(pickle.dumps(make_mixture_fn(TINY_MIX, rank=2, seed=10)))
    env = fn()
    assert env.default_seed == 12 and env.settings == load_mixture(TINY_MIX)[1]


@pytest.mark.parametrize(("change", "message"), [
    ({"weights": [1]}, "unknown field 'weights'; valid fields: name, description, episode"),
    ({"settings": [{"cluster": "tiny-2p2d", "speed": 2}]}, "settings\\[0\\]: unknown field "
                                                          "'speed'"),
    ({"settings": [], "generated": None}, "no settings"),
    ({"generated": {**TINY_MIX["generated"], "load": [2.0, 1.0]}},
     "generated'.load must be \\[lowest, highest\\]"),
    ({"generated": {**TINY_MIX["generated"], "count": 0}}, "generated'.count must be an "
                                                           "integer >= 1"),
    ({"generated": {**TINY_MIX["generated"], "clusters": {"prefill": [3]}}},
     "generated'.clusters: .*prefill must be \\[lowest, highest\\]"),
    ({"settings": [{"cluster": "tiny-2p2d", "trace": "nope"}]}, "setting 0 \\(tiny-2p2d / "
                                                               "nope\\): .*unknown trace"),
    ({"settings": [{"cluster": "tiny-2p2d", "max_calls_per_decision": 8}]},
     "setting 1 has window K=4 but setting 0 has K=8"),
])
def test_bad_mixtures_name_the_field(change, message):
    with pytest.raises(ConfigError, match=message):
        MixtureEnv({**TINY_MIX, **change})


def test_a_mixture_file_error_names_the_file(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("name: m\nsettings:\n  - {cluster: tiny-2p2d, trace: bfcl_v3, lod: 1}\n")
    with pytest.raises(ConfigError,
                       match=f"{path}: settings\\[0\\]: unknown field 'lod'.*Did you mean: `load`"):
        MixtureEnv(path)
    with pytest.raises(ConfigError, match="unknown mixture 'nope'; known: bfcl-mix"):
        MixtureEnv("nope")


def test_gymnasium_and_sb3_checkers_pass():
    from gymnasium.utils.env_checker import check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    check_env(MixtureEnv(TINY_MIX), skip_render_check=True)
    sb3_check_env(MixtureEnv(TINY_MIX), warn=False)
