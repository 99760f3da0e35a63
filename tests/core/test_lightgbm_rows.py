"""LightGBM's one-row fast path and the flattened trees the compiled kernel walks give exactly
Booster.predict's raw scores (every split kind, missing-value rule and threshold edge), and
copies of a predictor (pickled for workers, deep-copied by fork) each hold their own C handle."""

import copy
import pickle
import struct

import lightgbm
import numpy as np
import pytest

from hexagent_gym.futures.lightgbm_rows import RowPredictor, flatten_booster
from hexagent_gym.planning import kernels


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
    assert RowPredictor(booster, 4).fast_predict(rows.tolist()) == expect.tolist()
    assert RowPredictor(booster, 4, rows.tolist()).predict(rows.tolist()) == expect.tolist()


def test_copies_rebuild_their_own_handle_and_agree():
    fast = RowPredictor(_booster(), 4)
    row = [[1.0, 0.5, -0.2, 3.0]]
    first = fast.predict(row)
    for other in (pickle.loads(pickle.dumps(fast)), copy.deepcopy(fast)):
        assert other._handle is None  # never the original's pointer
        assert other.predict(row) == first
    del fast  # frees its handle; the copies keep working
    assert other.predict(row) == first


def _edge_rows(booster: lightgbm.Booster, num_features: int,
               rng: np.random.Generator) -> np.ndarray:
    """Random rows, then per split of ``booster`` rows at its threshold and the doubles either
    side of it (each category of a categorical split, one past them, negatives, NaN), the
    other features random."""
    rows = [rng.normal(size=num_features) for _ in range(200)]
    for info in booster.dump_model()["tree_info"]:
        stack = [info["tree_structure"]]
        while stack:
            node = stack.pop()
            if "split_index" not in node:
                continue
            stack += [node["left_child"], node["right_child"]]
            if node["decision_type"] == "==":
                cats = [float(c) for c in str(node["threshold"]).split("||")]
                values = [*cats, max(cats) + 1.0, 40.0, -0.5, -1.0, 2.0 ** 40, np.nan]
            else:
                t = float(node["threshold"])
                values = [np.nextafter(t, -np.inf), t, np.nextafter(t, np.inf), 0.0, 1e-40,
                          -1e-40, np.nan]
            for v in values:
                row = rng.normal(size=num_features)
                row[int(node["split_feature"])] = v
                rows.append(row)
    return np.asarray(rows)


def _trained(objective: str, zero_as_missing: bool = False, nan_share: float = 0.0,
             rounds: int = 20) -> lightgbm.Booster:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(600, 5))
    x[:, 0] = rng.integers(0, 40, 600)  # more categories than one 32-bit word holds
    x[rng.random((600, 5)) < nan_share] = np.nan
    x[:, 3] = np.where(rng.random(600) < 0.3, 0.0, x[:, 3])  # zeros, for zero-as-missing
    y = np.nan_to_num(x[:, 1]) * 2.0 + np.sin(np.nan_to_num(x[:, 2])) + (x[:, 0] % 7) * 0.3
    params = {"objective": objective, "num_leaves": 15, "num_threads": 1, "deterministic": True,
              "verbose": -1, "seed": 0, "zero_as_missing": zero_as_missing,
              "min_data_in_leaf": 5, "cat_smooth": 1.0, "min_data_per_group": 5}
    if objective == "quantile":
        params["alpha"] = 0.1
    data = lightgbm.Dataset(x, y, categorical_feature=[0], params={"verbose": -1})
    return lightgbm.train(params, data, num_boost_round=rounds)


@pytest.mark.skipif(kernels.ensemble_score is None, reason="compiled kernels not built")
@pytest.mark.parametrize("objective, zero_as_missing, nan_share", [
    ("quantile", False, 0.0), ("regression", False, 0.1), ("regression", True, 0.0),
    ("quantile", True, 0.05)])
def test_flattened_trees_score_exactly_as_lightgbm(objective, zero_as_missing, nan_share):
    booster = _trained(objective, zero_as_missing, nan_share)
    model = booster.dump_model()["tree_info"]
    kinds = {n["decision_type"] for info in model for n in _nodes(info["tree_structure"])}
    missing = {n["missing_type"] for info in model for n in _nodes(info["tree_structure"])}
    assert kinds == {"<=", "=="}  # the model exercises both split kinds
    if zero_as_missing:
        assert "Zero" in missing
    if nan_share:
        assert "NaN" in missing
    rows = _edge_rows(booster, 5, np.random.default_rng(4))
    expect = booster.predict(rows, raw_score=True, num_threads=1).tolist()
    blob = flatten_booster(booster, 5)
    assert [kernels.ensemble_score(blob, r) for r in rows.tolist()] == expect
    fast = RowPredictor(booster, 5, rows.tolist())
    assert fast.predict(rows.tolist()) == expect and fast._blob == blob  # the check passed


def _nodes(tree: dict) -> list[dict]:
    if "split_index" not in tree:
        return []
    return [tree, *_nodes(tree["left_child"]), *_nodes(tree["right_child"])]


@pytest.mark.skipif(kernels.ensemble_score is None, reason="compiled kernels not built")
def test_a_one_leaf_model_scores_its_constant():
    x = np.zeros((50, 2))
    y = np.full(50, 1.5)
    booster = lightgbm.train({"objective": "regression", "verbose": -1, "num_threads": 1},
                             lightgbm.Dataset(x, y, params={"verbose": -1}), num_boost_round=3)
    rows = [[0.0, 0.0], [3.0, -2.0]]
    expect = booster.predict(np.asarray(rows), raw_score=True).tolist()
    assert [kernels.ensemble_score(flatten_booster(booster, 2), r) for r in rows] == expect


@pytest.mark.skipif(kernels.ensemble_score is None, reason="compiled kernels not built")
def test_a_block_that_disagrees_is_not_used(monkeypatch):
    booster = _booster()
    rows = np.random.default_rng(2).normal(size=(30, 4)).tolist()
    good = flatten_booster(booster, 4)
    # a block whose leaf values are all off by one: the check on the given rows refuses it
    _, _, nodes, leaves, _ = struct.unpack_from("<5q", good)
    at = 40 + 8 * booster.num_trees() + 16 * nodes
    values = struct.unpack_from(f"<{leaves}d", good, at)
    bad = (good[:at] + struct.pack(f"<{leaves}d", *[v + 1.0 for v in values])
           + good[at + 8 * leaves:])
    monkeypatch.setattr("hexagent_gym.futures.lightgbm_rows.flatten_booster", lambda b, n: bad)
    fast = RowPredictor(booster, 4, rows)
    assert fast.predict(rows) == booster.predict(np.asarray(rows), raw_score=True).tolist()
    assert fast._blob is None and fast.scorer() is None  # LightGBM's fast path answered


@pytest.mark.skipif(kernels.ensemble_score is None, reason="compiled kernels not built")
def test_ensemble_score_refuses_bad_input():
    blob = flatten_booster(_booster(), 4)
    with pytest.raises(ValueError, match="3 values, the model 4 features"):
        kernels.ensemble_score(blob, [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="not a flattened ensemble"):
        kernels.ensemble_score(blob[:-8], [1.0, 2.0, 3.0, 4.0])
    # a node whose child is itself (a walk that would never end), a feature past the row's, a
    # leaf past the tree's: each refused when the block is checked, before any walk
    trees = struct.unpack_from("<5q", blob)[0]
    node0 = 40 + 8 * trees
    for offset, fmt, value in ((8, "<h", 0), (12, "<B", 9), (8, "<h", -100)):
        bad = bytearray(blob)
        struct.pack_into(fmt, bad, node0 + offset, value)
        with pytest.raises(ValueError, match="not a flattened ensemble"):
            kernels.ensemble_score(bytes(bad), [1.0, 2.0, 3.0, 4.0])
    assert kernels.ensemble_score(blob, [1.0, 2.0, 3.0, 4.0]) == \
        _booster().predict(np.asarray([[1.0, 2.0, 3.0, 4.0]]), raw_score=True)[0]
    with pytest.raises(TypeError):
        kernels.ensemble_score(bytearray(blob), [1.0, 2.0, 3.0, 4.0])
    with pytest.raises(TypeError):
        kernels.ensemble_score(blob, [1.0, 2.0, "x", 4.0])


def test_linear_trees_are_answered_by_lightgbm_itself():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(300, 3))
    y = x[:, 0] * 3.0 + x[:, 1]
    params = {"objective": "regression", "linear_tree": True, "verbose": -1, "num_threads": 1}
    booster = lightgbm.train(params, lightgbm.Dataset(x, y, params={"verbose": -1}), 5)
    with pytest.raises(ValueError, match="linear trees"):
        flatten_booster(booster, 3)
    fast = RowPredictor(booster, 3, x.tolist())
    assert fast.predict(x[:20].tolist()) == booster.predict(x[:20], raw_score=True).tolist()
    assert fast.scorer() is None
