"""LightGBM's one-row fast path gives exactly Booster.predict's raw scores, and copies of a
predictor (pickled for workers, deep-copied by fork) each hold their own C handle."""

import copy
import pickle

import lightgbm
import numpy as np

from hexagent_gym.futures.lightgbm_rows import RowPredictor


def _booster() -> lightgbm.Booster:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 4))
    x[:, 0] = rng.integers(0, 5, 400)  # a categorical column, as the application id is
    y = x[:, 1] * 2.0 + np.sin(x[:, 2]) + x[:, 0] * 0.3
    params = {"objective": "quantile", "alpha": 0.1, "num_leaves": 7, "num_threads": 1,
              "deterministic": True, "verbose": -1, "seed": 0}
    data = lightgbm.Dataset(x, y, categorical_feature=[0], params={"verbose": -1})
    return lightgbm.train(params, data, num_boost_round=20)


def test_one_row_scores_equal_booster_predict_bit_for_bit():
    booster = _booster()
    rows = np.random.default_rng(1).normal(size=(50, 4))
    rows[:, 0] = np.arange(50) % 6  # category 5 was never seen in training
    expect = booster.predict(rows, raw_score=True, num_threads=1)
    assert RowPredictor(booster, 4).predict(rows.tolist()) == expect.tolist()


def test_copies_rebuild_their_own_handle_and_agree():
    fast = RowPredictor(_booster(), 4)
    row = [[1.0, 0.5, -0.2, 3.0]]
    first = fast.predict(row)
    for other in (pickle.loads(pickle.dumps(fast)), copy.deepcopy(fast)):
        assert other._handle is None  # never the original's pointer
        assert other.predict(row) == first
    del fast  # frees its handle; the copies keep working
    assert other.predict(row) == first
