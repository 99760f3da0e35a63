"""hexagent_gym.agents.training: the training pipeline as a library (TrainConfig → train →
TrainResult)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch as th

from hexagent_gym.agents.callbacks import rollout_stats
from hexagent_gym.agents.learned import make_model
from hexagent_gym.agents.training import (
    TrainConfig,
    TrainConfigError,
    episode_config,
    train,
    warm_start,
)
from hexagent_gym.config import ConfigError
from hexagent_gym.envs.pd_cluster_env import PDClusterEnv

th.set_num_threads(1)

# the tiniest run: 2P+2D cluster, 8-workflow episodes, one env, two PPO rollouts of 64 steps
TINY = dict(cluster="tiny-2p2d", num_workflows=8, load=1.5, n_envs=1, n_steps=64,
            batch_size=32, total_timesteps=128, eval_seeds=(10_000, 10_001), verbose=0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("tiny")
    rows: list[dict[str, float]] = []
    # the MLP with a high learning rate moves away from its start within two rollouts
    config = TrainConfig(policy="mlp", lr=1e-3, ent_coef=0.01, logdir=logdir, **TINY)
    return train(config, on_eval=rows.append), rows


def test_result_names_the_files_it_wrote(tiny):
    result, _ = tiny
    config = result.config
    assert result.model_path == config.logdir / "model.zip" and result.model_path.is_file()
    assert result.best_model_path == config.logdir / "best_model.zip"
    assert result.best_model_path.is_file()
    assert list(config.logdir.glob("events.out.tfevents.*"))
    assert (config.logdir / "progress.csv").is_file()
    record = json.loads(result.run_record.read_text())
    assert record["args"] == json.loads(json.dumps(config.to_dict()))
    assert record["history"] == [{k: v for k, v in row.items() if k != "reward"}
                                 for row in result.history]
    assert record["final_eval"] == record["history"][-1]
    assert record["best_eval_req99"] == result.best_req99
    assert record["best_step"] == result.best_step
    assert record["reference"] == result.reference and record["bc"] == result.bc == {}


def test_result_figures_are_consistent(tiny):
    result, rows = tiny
    assert rows == list(result.history)  # on_eval saw every evaluation as it ran
    steps = [row["timesteps"] for row in result.history]
    assert steps[0] == 0 and steps[-1] >= result.config.total_timesteps
    assert result.final_eval is result.history[-1]
    assert (result.req95, result.req99) == (result.final_eval["req95"],
                                            result.final_eval["req99"])
    assert result.best_req99 == min(row["req99"] for row in result.history)
    best_row = next(row for row in result.history if row["req99"] == result.best_req99)
    assert result.best_step == best_row["timesteps"]
    assert 1.0 <= result.req95 <= result.req99
    assert result.train_rewards and all(np.isfinite(result.train_rewards))
    assert set(result.timings) == {"ppo_s"}
    assert str(result.model_path) in result.summary()


def _fresh_eval(config: TrainConfig, path) -> dict[str, float]:
    """Load a saved model and roll it out on the config's evaluation episodes."""
    from sb3_contrib import MaskablePPO

    episodes, overrides = episode_config(config)
    env = PDClusterEnv(episodes, **overrides)
    model = MaskablePPO.load(path, device="cpu")
    results = [env.rollout(model, seed=s, deterministic=True) for s in config.eval_seeds]
    return {**rollout_stats(results, (1.5,)),
            "reward": float(np.mean([r.total_reward for r in results]))}


def test_saved_models_reproduce_their_evaluations(tiny):
    """The final evaluation runs after the last PPO update (eval_every > total_timesteps), so it
    is the saved model's; best_model.zip is the model of the best evaluation."""
    result, _ = tiny
    keys = ("req95", "req99", "mean_ratio", "attainment@1.5", "reward")
    final = _fresh_eval(result.config, result.model_path)
    assert {k: final[k] for k in keys} == {k: result.final_eval[k] for k in keys}
    best = _fresh_eval(result.config, result.best_model_path)
    assert best["req99"] == result.best_req99


def test_final_evaluation_follows_the_last_update(tmp_path):
    """An evaluation due on the last rollout's final step runs before that rollout's PPO update;
    training end then evaluates again, so the final evaluation is the saved model's."""
    config = TrainConfig(policy="mlp", lr=1e-3, ent_coef=0.01, logdir=tmp_path,
                         **(TINY | {"eval_every": 64}))
    result = train(config)
    steps = [row["timesteps"] for row in result.history]
    assert steps == [0, 64, 128, 128]  # the last two: before and after the final update
    keys = ("req95", "req99", "mean_ratio", "attainment@1.5", "reward")
    final = _fresh_eval(result.config, result.model_path)
    assert {k: final[k] for k in keys} == {k: result.final_eval[k] for k in keys}


def test_warm_start_clones_the_teacher():
    env = PDClusterEnv(None, cluster="tiny-2p2d", trace="bfcl_v3", num_workflows=6, load=1.5)
    th.manual_seed(0)
    model = make_model(env, "equivariant", n_steps=64, batch_size=32, device="cpu")
    done = warm_start(model, env, episodes=1, epochs=1, dagger_rounds=1, dagger_episodes=1,
                      target_prob=0.5)
    assert list(done.stats) == ["logit_scale", "samples", "loss", "accuracy", "exact"]
    assert done.stats["samples"] > 0 and 0.0 <= done.stats["accuracy"] <= 1.0
    assert done.stats["logit_scale"] > 0.0
    # the held-out loss after calibration is −log of the target geometric-mean probability
    assert done.stats["loss"] == pytest.approx(-np.log(0.5), abs=0.05)
    assert 0.0 <= done.collect_s <= done.total_s


@pytest.mark.parametrize(("change", "message"), [
    ({"n_envs": 0}, "TrainConfig.n_envs must be an integer >= 1, got 0"),
    ({"vec": "threads"}, "TrainConfig.vec must be one of 'dummy', 'subproc', got 'threads'"),
    ({"init_from": "fcfs"}, "TrainConfig.init_from must be one of 'none', 'hexagent', "
                            "'hexagent-lookahead', 'hexagent-search'"),
    ({"mixture": 3}, "TrainConfig.mixture must be a mixture name or YAML path, got 3"),
    ({"demos": "d.npz"}, "TrainConfig.demos caches a teacher's demonstrations: it needs "
                         "init_from"),
    ({"gamma": 1.5}, r"TrainConfig.gamma must be a number in \(0, 1\], got 1.5"),
    ({"lr": float("nan")}, "TrainConfig.lr must be a number > 0, got nan"),
    ({"batch_size": 1}, "TrainConfig.batch_size must be an integer >= 2, got 1"),
    ({"num_workflows": 2.5}, "TrainConfig.num_workflows must be an integer >= 1 or None"),
    ({"load": -1.0}, "TrainConfig.load must be a number > 0 or None, got -1.0"),
    ({"eval_seeds": ()}, "TrainConfig.eval_seeds must list at least one reset seed"),
    ({"eval_seeds": "10000"}, "TrainConfig.eval_seeds must be a sequence of integer"),
    ({"bc_target_prob": 1.0}, r"TrainConfig.bc_target_prob must be a probability in \[0, 1\)"),
    ({"policy": "mlp", "bc_target_prob": 0.9}, "TrainConfig.bc_target_prob must be 0 with "
                                               "policy='mlp'"),
    ({"logdir": None}, "TrainConfig.logdir must be a path, got None"),
])
def test_an_invalid_field_raises_an_error_naming_it(change, message):
    with pytest.raises(TrainConfigError, match=message) as err:
        TrainConfig(**change)
    assert err.value.field in change
    assert isinstance(err.value, ConfigError)  # as the env's own configuration errors
    with pytest.raises(TrainConfigError, match=message):  # replace() validates too
        dataclasses.replace(TrainConfig(), **change)


def test_config_normalises_paths_and_seeds(tmp_path):
    config = TrainConfig(logdir=str(tmp_path), eval_seeds=[np.int64(3), 4])
    assert config.logdir == tmp_path and config.eval_seeds == (3, 4)
    assert config.model_path == tmp_path / "model.zip"
    assert TrainConfig(out="m.zip").model_path.name == "m.zip"


def test_unknown_episode_names_fail_before_writing(tmp_path):
    with pytest.raises(ConfigError, match="unknown cluster 'nope'"):
        train(TrainConfig(cluster="nope", logdir=tmp_path / "run", verbose=0))
    assert not (tmp_path / "run").exists()
