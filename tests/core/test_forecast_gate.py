"""The forecast gate: a horizon forecast is used for an application only while the forecasts
made for its finished workflows have been accurate (hand-computed cases), and it learns from
finished workflows only."""

from __future__ import annotations

import math

import pytest

from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.futures.horizon_predictors import AppMeanPredictor, HorizonPredictor, scopes
from hexagent_gym.futures.horizon_tracker import MIN_ROWS, ForecastGate
from hexagent_gym.planning.decisions import earliest_finish_pick


def test_an_application_is_trusted_while_its_log_rmse_is_within_the_limit():
    gate = ForecastGate(0.5)
    assert gate.trusted("a") and gate.error("a") is None  # nothing on record: used
    gate.record("a", [math.log(2.0)] * MIN_ROWS, math.log(2.0) + 0.4)  # every error 0.4
    assert gate.error("a") == pytest.approx(0.4) and gate.trusted("a")
    gate.record("b", [0.0] * MIN_ROWS, 0.6)  # errors 0.6
    assert gate.error("b") == pytest.approx(0.6) and not gate.trusted("b")
    # all applications: 20 at 0.4 and 20 at 0.6 -> sqrt((0.16 + 0.36) / 2)
    assert gate.error("c") == pytest.approx(math.sqrt(0.26)) and not gate.trusted("c")
    gate.record("a", [0.0] * MIN_ROWS, 1.0)  # a's forecasts go bad: sqrt((0.16 + 1) / 2)
    assert gate.error("a") == pytest.approx(math.sqrt(0.58)) and not gate.trusted("a")


def test_an_application_with_few_forecasts_is_judged_by_its_family_first():
    gate = ForecastGate(0.7)
    gate.record("lats", [0.0] * 100, 1.0)  # another family: error 1.0, most of the record
    gate.record("bfcl_v3/simple", [0.0] * MIN_ROWS, 0.3)  # error 0.3
    gate.record("bfcl_v3/parallel", [0.0] * 3, 0.5)  # too few of its own
    assert scopes("bfcl_v3/parallel") == ("bfcl_v3/parallel", "bfcl_v3", None)
    assert scopes("lats") == ("lats", None)
    # bfcl_v3 holds 20 at 0.3 and 3 at 0.5
    assert gate.error("bfcl_v3/parallel") == pytest.approx(math.sqrt((20 * 0.09 + 3 * 0.25) / 23))
    assert gate.trusted("bfcl_v3/parallel") and not gate.trusted("lats")
    assert not gate.trusted("sharegpt")  # no record, no family: every application's error


def test_too_few_forecasts_of_an_application_defer_to_all_of_them():
    gate = ForecastGate(0.5, warm={None: (0.01 * MIN_ROWS, MIN_ROWS), "x": (9.0, 1)})
    assert gate.error("x") == pytest.approx(0.1) and gate.trusted("x")  # x's one row: too few
    assert ForecastGate(None, warm={None: (100.0, MIN_ROWS)}).trusted("x")  # no limit


def test_a_forecast_is_used_only_where_it_exceeds_the_running_horizon_by_more_than_its_error():
    gate = ForecastGate(0.5)
    gate.record("a", [0.0] * MIN_ROWS, 0.3)  # a's error: 0.3
    # log(1.2 / 1.0) = 0.18 <= 0.3: within a's error of the running horizon, not used
    assert gate.use("a", 1.2, 1.0) == 0.0
    # log(1.5 / 1.0) = 0.41 > 0.3: used as is
    assert gate.use("a", 1.5, 1.0) == 1.5
    assert gate.use("a", 0.8, 1.0) == 0.0  # below the running horizon: says nothing more
    # no error on record yet (another family, nothing for all): every forecast is used
    fresh = ForecastGate(0.5)
    assert fresh.use("b", 1.01, 1.0) == 1.01
    gate.record("b", [0.0] * MIN_ROWS, 0.6)  # b's error 0.6 is over the limit: never used
    assert gate.use("b", 100.0, 1.0) == 0.0
    # no limit: the gate is off, and so is the margin
    assert ForecastGate(None, warm={"a": (0.09 * MIN_ROWS, MIN_ROWS)}).use("a", 1.2, 1.0) == 1.2


class _Constant(HorizonPredictor):
    """Forecasts 10 s for every workflow (accurate for few of them) and counts its forecasts."""

    name = "constant"
    gate = 0.5

    def __init__(self) -> None:
        self.made: dict[int, int] = {}

    def predict(self, rows):
        for wf, _ in rows:
            self.made[wf.uid] = self.made.get(wf.uid, 0) + 1
        return [10.0] * len(rows)


def test_the_gate_scores_exactly_the_forecasts_of_finished_workflows():
    cfg = EpisodeConfig(cluster="asym-2p8d", trace="bfcl_v3", num_workflows=40,
                        arrival_rate=40.0, load=None)
    predictor = _Constant()
    sim = EpisodeFactory(cfg).simulator(0, horizon_predictor=predictor)
    gate = sim.horizon_tracker.gate
    dp = sim.run_until_decision()
    gated = used = 0
    while dp is not None:
        # by hand: every forecast of each finished workflow was 10 s
        n = sum(predictor.made.get(w.uid, 0) for w in sim.finished)
        sq = sum(predictor.made.get(w.uid, 0) * (math.log(10.0) - math.log(w.horizon)) ** 2
                 for w in sim.finished)
        held = gate._sq.get(None, [0.0, 0])
        assert held[1] == n and held[0] == pytest.approx(sq, rel=1e-12)
        for c in dp.calls:
            w = c.workflow
            trusted = gate.trusted(w.spec.app_id)
            assert w.h_pred == (10.0 if trusted else 0.0)
            used, gated = used + trusted, gated + (not trusted)
        while not dp.done:
            dp.pick(*earliest_finish_pick(dp))
        dp = sim.run_until_decision()
    assert used > 0 and gated > 0  # used until the finished ones showed how wrong it was


def test_app_mean_starts_from_its_warm_in_sample_error():
    warm = [("a", 1.0), ("a", math.e ** 2)]  # mean of logs 1: each off by 1
    p = AppMeanPredictor(warm, gate=0.5)
    assert p.warm_errors() == {"a": (2.0, 2), None: (2.0, 2)}
    family = AppMeanPredictor([("f/a", 1.0), ("f/a", math.e ** 2)], gate=0.5)
    assert family.warm_errors() == {"f/a": (2.0, 2), "f": (2.0, 2), None: (2.0, 2)}
    assert p.fresh().warm_errors() == p.warm_errors()


def test_all_trusted_needs_every_workflows_application_trusted():
    from types import SimpleNamespace as NS

    gate = ForecastGate(0.5)
    gate.record("a", [0.0] * MIN_ROWS, 0.2)
    gate.record("b", [0.0] * MIN_ROWS, 0.9)
    wf = {app: NS(spec=NS(app_id=app)) for app in "abc"}
    assert gate.all_trusted([wf["a"], wf["a"]]) and gate.all_trusted([])
    assert not gate.all_trusted([wf["a"], wf["b"]])
    # c has no record of its own and no family: all applications' error, sqrt((0.04+0.81)/2)
    assert not gate.all_trusted([wf["c"]])


def test_a_record_moves_an_applications_version_only_where_a_gated_answer_changes():
    gate = ForecastGate(0.7)
    gate.record("a", [0.0] * MIN_ROWS, 0.4)  # a's error 0.4 (3.2 over 20)
    assert gate.trusted("a") and gate.judgement["a"] == (True, pytest.approx(0.4))
    gate.watch("a", None, 0.5)  # a forecast in use whose margin over H_w(t) is 0.5
    gate.record("a", [0.0] * MIN_ROWS, 0.5)  # sqrt(8.2 / 40) = 0.453: still below 0.5
    assert gate.app_version.get("a", 0) == 0
    assert gate.judgement["a"][1] == pytest.approx(math.sqrt(8.2 / 40))
    gate.record("b", [0.0] * MIN_ROWS, 0.1)  # another application's own record: a unread
    assert gate.app_version.get("a", 0) == 0 and not gate.moved
    gate.record("a", [0.0] * MIN_ROWS, 0.7)  # sqrt(18 / 60) = 0.548: the 0.5 margin flips
    assert gate.app_version["a"] == 1 and gate.use("a", math.exp(0.5), 1.0) == 0.0
    assert gate.moved == {"a"}  # for the tracker to clear (it empties the set)
    gate.moved.clear()
    gate.watch("a", 0.5, None)  # that forecast is gone: only the trust matters now
    gate.record("a", [0.0] * MIN_ROWS, 0.6)  # sqrt(25.2 / 80) = 0.561: nothing to flip
    assert gate.app_version["a"] == 1
    gate.record("a", [0.0] * 3 * MIN_ROWS, 1.0)  # sqrt(85.2 / 140) = 0.78 > 0.7: distrusted
    assert gate.app_version["a"] == 2 and not gate.trusted("a")


def test_an_application_judged_by_its_family_moves_with_the_family():
    gate = ForecastGate(0.7)
    gate.record("f/x", [0.0] * MIN_ROWS, 0.3)
    gate.record("f/y", [0.0] * 2, 0.3)  # too few of its own: the family decides for f/y
    assert gate.trusted("f/y") and gate.trusted("f/x")
    gate.record("f/x", [0.0] * 4 * MIN_ROWS, 1.0)  # the family's error goes over the limit
    assert gate.app_version == {"f/x": 1, "f/y": 1} and gate.moved == {"f/x", "f/y"}
    assert not gate.trusted("f/x") and not gate.trusted("f/y")
