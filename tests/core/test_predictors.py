"""Output-length predictors: contract, defaults and validation."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from hexagent_gym.futures.predictors import (
    DEFAULT_PREDICTOR,
    PREDICTORS,
    BucketPredictor,
    LogNormalPredictor,
    OraclePredictor,
    make_predictor,
    predictor_from_config,
    relative_error_summary,
)

LENGTHS = np.array([1, 2, 7, 15, 16, 31, 100, 500, 2047, 2048, 9000], dtype=np.int64)


def _state(rng: np.random.Generator) -> dict:
    return copy.deepcopy(rng.bit_generator.state)


def test_registry_and_default():
    assert PREDICTORS == ("oracle", "lognormal", "bucket")
    assert DEFAULT_PREDICTOR == "lognormal"
    assert isinstance(make_predictor(), LogNormalPredictor)
    assert make_predictor("lognormal") == LogNormalPredictor(sigma=0.5, bias=0.0)
    assert make_predictor("bucket") == BucketPredictor(
        edges=(16, 32, 64, 128, 256, 512, 1024, 2048), accuracy=0.7)
    for name in PREDICTORS:
        p = make_predictor(name)
        assert p.name == name and p.describe().startswith(name)
        with pytest.raises(AttributeError):
            p.name = "x"  # type: ignore[misc]


def test_oracle_is_identity_and_leaves_rng_untouched():
    rng = np.random.default_rng(3)
    before = _state(rng)
    out = make_predictor("oracle").predict(LENGTHS, rng)
    assert rng.bit_generator.state == before
    assert out.dtype == np.int64 and np.array_equal(out, LENGTHS)
    assert out is not LENGTHS
    assert np.array_equal(OraclePredictor().predict([5, 6], None), [5, 6])


def test_lognormal_zero_sigma_is_oracle_but_consumes_draws():
    rng = np.random.default_rng(5)
    out = make_predictor("lognormal", sigma=0.0, bias=0.0).predict(LENGTHS, rng)
    assert np.array_equal(out, LENGTHS)
    ref = np.random.default_rng(5)
    ref.standard_normal(LENGTHS.size)
    assert rng.bit_generator.state == ref.bit_generator.state


def test_lognormal_deterministic_and_documented_draws():
    p = make_predictor("lognormal")
    a = p.predict(LENGTHS, np.random.default_rng(11))
    b = p.predict(LENGTHS, np.random.default_rng(11))
    assert np.array_equal(a, b)
    rng = np.random.default_rng(11)
    z = rng.standard_normal(LENGTHS.size)
    assert np.array_equal(a, np.maximum(1, np.rint(LENGTHS * np.exp(0.5 * z))).astype(np.int64))


@pytest.mark.parametrize("bias", [0.0, 0.3, -0.4])
def test_lognormal_median_ratio_is_exp_bias(bias):
    lengths = np.full(20_000, 1000, dtype=np.int64)
    out = make_predictor("lognormal", sigma=0.5, bias=bias).predict(
        lengths, np.random.default_rng(0))
    assert np.median(out / lengths) == pytest.approx(np.exp(bias), rel=0.02)


def test_bucket_midpoints_and_perfect_accuracy():
    p = make_predictor("bucket", accuracy=1.0)
    # first: 16/2; inner: rint(sqrt(lo*hi)), e.g. sqrt(64*128) = 90.51 -> 91; last: 2*2048
    assert p.midpoints().tolist() == [8, 23, 45, 91, 181, 362, 724, 1448, 4096]
    cases = {1: 8, 15: 8, 16: 23, 31: 23, 32: 45, 100: 91, 127: 91, 128: 181, 500: 362,
             2047: 1448, 2048: 4096, 9000: 4096}
    rng = np.random.default_rng(0)
    out = p.predict(np.array(list(cases), dtype=np.int64), rng)
    assert out.tolist() == list(cases.values())
    ref = np.random.default_rng(0)
    ref.random((len(cases), 2))
    assert rng.bit_generator.state == ref.bit_generator.state


def test_bucket_accuracy_share_and_adjacent_errors():
    p = make_predictor("bucket")  # accuracy 0.7
    lengths = np.random.default_rng(1).integers(16, 2048, size=20_000)  # inner buckets only
    out = p.predict(lengths, np.random.default_rng(2))
    mids = p.midpoints()
    true_b = p.bucket_of(lengths)
    picked = np.searchsorted(mids, out)
    assert np.array_equal(mids[picked], out)
    assert np.mean(picked == true_b) == pytest.approx(0.7, abs=0.015)
    assert np.all(np.abs(picked - true_b) <= 1)
    wrong = picked != true_b
    assert np.mean(picked[wrong] > true_b[wrong]) == pytest.approx(0.5, abs=0.03)


def test_bucket_clamps_at_the_ends():
    p = make_predictor("bucket", accuracy=0.0)
    out = p.predict(np.array([3] * 200 + [5000] * 200), np.random.default_rng(4))
    assert set(out[:200].tolist()) == {8, 23}
    assert set(out[200:].tolist()) == {1448, 4096}


def test_bucket_custom_edges_never_below_one():
    p = make_predictor("bucket", edges=[1, 3], accuracy=0.0)
    assert p.midpoints().tolist() == [1, 2, 6]  # 0.5 -> 1, rint(sqrt(3)) = 2, 2*3
    out = p.predict(np.arange(1, 50), np.random.default_rng(0))
    assert out.min() >= 1


@pytest.mark.parametrize("name", PREDICTORS)
def test_every_output_at_least_one_and_same_shape(name):
    p = make_predictor(name, **({"sigma": 3.0, "bias": -5.0} if name == "lognormal" else {}))
    lengths = np.random.default_rng(9).integers(1, 5000, size=(50, 40))
    out = p.predict(lengths, np.random.default_rng(10))
    assert out.shape == lengths.shape and out.dtype == np.int64 and out.min() >= 1
    empty = p.predict(np.array([], dtype=np.int64), np.random.default_rng(0))
    assert empty.shape == (0,)


def test_unknown_name_lists_known_and_suggests():
    msg = r"known: oracle, lognormal, bucket.*Did you mean: `lognormal`"
    with pytest.raises(ValueError, match=msg):
        make_predictor("lognormall")


@pytest.mark.parametrize(
    ("name", "params", "match"),
    [
        ("lognormal", {"sigmaa": 1.0}, r"no parameter 'sigmaa'; accepted: sigma, bias.*`sigma`"),
        ("oracle", {"sigma": 1.0}, "takes no parameters"),
        ("lognormal", {"sigma": -0.1}, "sigma must be >= 0"),
        ("lognormal", {"bias": float("inf")}, "bias must be a finite number"),
        ("lognormal", {"sigma": "0.5"}, "sigma must be a finite number"),
        ("lognormal", {"sigma": True}, "sigma must be a finite number"),
        ("bucket", {"accuracy": 1.5}, r"accuracy must be in \[0, 1\]"),
        ("bucket", {"accuracy": -0.1}, "accuracy must be >= 0"),
        ("bucket", {"edges": [32, 16]}, "strictly increasing"),
        ("bucket", {"edges": [0, 16]}, "positive"),
        ("bucket", {"edges": []}, "at least one edge"),
        ("bucket", {"edges": 16}, "list of numbers"),
    ],
)
def test_bad_params_raise(name, params, match):
    with pytest.raises(ValueError, match=match):
        make_predictor(name, **params)


def test_bad_inputs_raise():
    p = make_predictor("oracle")
    with pytest.raises(ValueError, match=">= 1"):
        p.predict(np.array([3, 0]), None)
    with pytest.raises(ValueError, match="integer"):
        p.predict(np.array([3.5]), None)


def test_predictor_from_config():
    assert predictor_from_config("bucket", {"accuracy": 0.9}).accuracy == 0.9
    assert predictor_from_config("oracle", None) == OraclePredictor()
    with pytest.raises(ValueError, match="must be a mapping"):
        predictor_from_config("lognormal", [0.5])


def test_relative_error_summary():
    s = relative_error_summary([10, 10, 10, 10], [5, 10, 12, 30])
    assert s == {"median_abs_rel_err": pytest.approx(0.35),
                 "mean_abs_rel_err": pytest.approx(0.675),
                 "share_under": 0.25, "share_over": 0.5, "n": 4}
    with pytest.raises(ValueError):
        relative_error_summary([1, 2], [1])
