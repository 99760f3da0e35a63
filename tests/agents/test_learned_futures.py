"""The learned scheduler that reads workflow futures (docs/learned_futures.md): it ranks every
waiting call on a simulator without a window, its bare-simulator path encodes the ``workflow``
key exactly as the env does, and a scaled-down imitation run trains and schedules."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch as th

from hexagent_gym.agents.equivariant_policy import make_model
from hexagent_gym.agents.learned import LearnedPolicy
from hexagent_gym.agents.training.futures import FuturesConfig, train_futures
from hexagent_gym.envs.app_sessions import app_sessions, write_app_sessions
from hexagent_gym.envs.pd_cluster_env import PDClusterEnv
from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.policy import run_policy

th.set_num_threads(1)

TINY = {"cluster": "tiny-2p2d", "trace": "bfcl_v3", "num_workflows": 40, "arrival_rate": 200.0,
        "load": None}


@pytest.fixture(scope="module")
def model():
    """An untrained equivariant model reading the ``workflow`` key, trained shapes K = 16: its
    prior makes it rank like ``hexagent-horizon``."""
    env = PDClusterEnv({**TINY, "num_workflows": 5}, workflow_obs=True)
    return make_model(env, "equivariant", seed=0, device="cpu",
                      policy_kwargs={"workflow_feature": True})


class _Recorder:
    """Wraps a LearnedPolicy; records (calls in the decision, slot picked)."""

    name = "recorder"

    def __init__(self, inner: LearnedPolicy) -> None:
        self.inner, self.picks = inner, []

    def reset(self, sim) -> None:
        self.inner.reset(sim)

    def pick(self, dp):
        slot, p, d = self.inner.pick(dp)
        self.picks.append((len(dp.calls), slot))
        return slot, p, d


def test_ranks_every_waiting_call_without_a_window(model):
    """Trained with K = 16, on a simulator without a window it encodes every waiting call of a
    decision and picks calls beyond the 16th (the window would never show them)."""
    factory = EpisodeFactory(EpisodeConfig(**{**TINY, "num_workflows": 25}))
    assert factory.config.max_calls_per_decision is None
    rec = _Recorder(LearnedPolicy(model))
    result = run_policy(factory.simulator(seed=0), rec)
    assert result.req99 > 0
    assert max(n for n, _ in rec.picks) > 16
    assert rec.inner._encoder.k >= max(n for n, _ in rec.picks)
    assert any(slot >= 16 for _, slot in rec.picks)


def test_bare_path_matches_env_with_workflow_key(model):
    """``LearnedPolicy.pick`` builds the ``workflow`` key as the env does: the same episode
    through the env (the model's ``predict``) and on the bare simulator gives the same Req99."""
    cfg = {**TINY, "num_workflows": 10, "horizon_predictor": "app-mean"}
    env = PDClusterEnv(cfg, workflow_obs=True)
    through_env = env.rollout(model, seed=1)
    bare = env.rollout(LearnedPolicy(model), seed=1)
    assert through_env.ratios.tolist() == bare.ratios.tolist()


def _futures_traces(tmp_path):
    """Two traces equal in every workflow's first two calls and in the whole train half; in the
    eval half, B changes the future: the last call's output and three more calls."""
    from hexagent_gym.episode import split_of

    rows_a = [r for r in app_sessions(120, seed=3) if len(r["calls"]) >= 3]
    rows_b = []
    changed = 0
    for row in rows_a:
        row = {**row, "calls": [dict(c) for c in row["calls"]]}
        if split_of(row["workflow_id"]) == "eval":
            last = row["calls"][-1]
            last["output_tokens"] = 3 * last["output_tokens"] + 7
            for _ in range(3):
                prev = row["calls"][-1]
                seen = prev["input_tokens"] + prev["output_tokens"]
                row["calls"].append({**prev, "id": str(int(prev["id"]) + 1),
                                     "parents": [prev["id"]], "input_tokens": seen + 100,
                                     "output_tokens": 50, "prefix_of": prev["id"],
                                     "prefix_tokens": seen})
            changed += 1
        rows_b.append(row)
    assert changed > 5
    paths = []
    for name, rows in (("a", rows_a), ("b", rows_b)):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(str(path))
    return paths


def test_observation_reads_no_unrevealed_future(tmp_path):
    """Every observation key (``workflow`` included, with a warm-started horizon forecast) is
    identical on two traces that differ only in calls not yet revealed, at every step until a
    workflow reveals its third call: a feature reading an unfinished workflow's future calls,
    their true lengths or its final horizon would differ. (The ``oracle`` length predictor,
    which predicts a revealed call's own length, draws no randomness; ``lognormal`` draws one
    number per call of the episode, so extra future calls would shift the stream.)"""
    from hexagent_gym.policy import make_policy

    envs = [PDClusterEnv(cluster="tiny-2p2d", trace=path, num_workflows=30, arrival_rate=30.0,
                         load=None, length_predictor="oracle", workflow_split="eval",
                         horizon_predictor="app-mean",
                         horizon_warm_start=1, workflow_obs=True) for path in
            _futures_traces(tmp_path)]
    obs = [env.reset(seed=0)[0] for env in envs]
    teacher = make_policy("hexagent-horizon")
    teacher.reset(envs[0].simulator)
    steps = 0
    while True:
        sims = [env.simulator for env in envs]
        if any(w.num_done + len(w.open_calls) > 2 for sim in sims for w in sim.workflows):
            break
        for key in obs[0]:
            np.testing.assert_array_equal(obs[0][key], obs[1][key], err_msg=key)
        if steps == 0:
            assert obs[0]["workflow"][:, 1].max() > 0  # the forecast is live
        dp = envs[0].decision_point
        action = envs[0].encode_action(*teacher.pick(dp))
        outs = [env.step(action) for env in envs]
        steps += 1
        if outs[0][2]:
            break
        obs = [o[0] for o in outs]
    assert steps > 20


def test_scaled_down_training_run(tmp_path):
    """Imitation of hexagent-horizon on a tiny mixture trains a model that reads the
    ``workflow`` key and schedules a whole unwindowed episode on another cluster."""
    trace = str(write_app_sessions(tmp_path / "synth.jsonl.gz", n=200, seed=0))
    mixture = {"episode": {"num_workflows": 12, "max_calls_per_decision": 16, "trace": trace,
                           "arrival_rate": 20.0, "load": None, "workflow_split": "eval",
                           "horizon_predictor": "app-mean", "horizon_warm_start": 1},
               "settings": [{"cluster": "tiny-2p2d"}]}
    config = FuturesConfig(seed=0, bc_episodes=1, bc_epochs=1, dagger_rounds=1,
                           dagger_episodes=1, hidden=16)
    trained, stats = train_futures(mixture, config)
    assert trained.policy.net.workflow_feature
    assert stats["samples"] > 0 and 0.0 <= stats["bc_accuracy"] <= 1.0
    path = tmp_path / "m.zip"
    trained.save(path)
    policy = LearnedPolicy.load(path)
    factory = EpisodeFactory(EpisodeConfig(**{**TINY, "num_workflows": 10}))
    assert run_policy(factory.simulator(seed=0), policy).req99 >= 1.0
