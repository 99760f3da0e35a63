"""The opt-in ``workflow`` observation key: each call's workflow as a front end knows it."""

from __future__ import annotations

import math
import zlib

import numpy as np
from stable_baselines3.common.env_checker import check_env

import hexagent_gym
from hexagent_gym.envs.encoding import APP_BUCKETS, CLIP, WORKFLOW_FEATURES

W = {name: i for i, name in enumerate(WORKFLOW_FEATURES)}
CONFIG = dict(cluster="asym-2p8d", trace="bfcl_v3", num_workflows=25, arrival_rate=40.0,
              load=None, workflow_split="eval", horizon_predictor="app-mean",
              horizon_warm_start=1, workflow_obs=True)


def test_off_by_default():
    env = hexagent_gym.make(cluster="tiny-2p2d", num_workflows=4)
    obs, _ = env.reset(seed=0)
    assert "workflow" not in obs and "workflow" not in env.observation_space.spaces


def test_rows_describe_each_slots_workflow_at_every_step():
    env = hexagent_gym.make(**CONFIG)
    check_env(env, warn=False)
    obs, _ = env.reset(seed=1)
    inv = 1.0 / env.options.time_scale
    rng = np.random.default_rng(0)
    steps = forecasts = 0
    previous = None
    while True:
        rows = obs["workflow"]
        assert rows.shape == (env.k, len(WORKFLOW_FEATURES)) and rows.dtype == np.float32
        assert rows is not previous  # a fresh array every step
        previous = rows
        dp = env.decision_point
        window = dp.calls[:env.k]
        for i, c in enumerate(window):
            w = c.workflow
            horizon = max(w.h_est, w.h_pred)
            assert rows[i, W["present"]] == 1.0
            assert rows[i, W["h_pred"]] == np.float32(min(w.h_pred * inv, CLIP))
            assert rows[i, W["horizon"]] == np.float32(min(horizon * inv, CLIP))
            assert rows[i, W["revealed"]] == np.float32(math.log1p(w.num_done
                                                                   + len(w.open_calls)))
            bucket = zlib.crc32(w.spec.app_id.encode()) % APP_BUCKETS
            onehot = rows[i, W["app_0"]:]
            assert onehot.sum() == 1.0 and onehot[bucket] == 1.0
            forecasts += w.h_pred > 0.0
        assert not rows[len(window):].any()  # padding
        valid = np.flatnonzero(env.action_masks())
        obs, _, terminated, _, _ = env.step(int(valid[rng.integers(len(valid))]))
        steps += 1
        if terminated:
            assert not obs["workflow"].any()
            break
    assert steps > 20 and forecasts > 0  # the warm-started app-mean forecasts from the start
