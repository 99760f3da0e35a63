"""Workflow identity through loading, the train/eval split, and the horizon predictors: what
they may read (revealed state, finished workflows only), determinism and bad input."""

from __future__ import annotations

import json
import math
import zlib
from collections import defaultdict

import numpy as np
import pytest

from hexagent_gym.config import ConfigError
from hexagent_gym.episode import EpisodeConfig, EpisodeFactory, split_of, split_trace
from hexagent_gym.futures.horizon_predictors import (
    AppMeanPredictor,
    HorizonPredictor,
    make_horizon_predictor,
    workflow_features,
)
from hexagent_gym.futures.horizon_tracker import HorizonTracker
from hexagent_gym.workload.specs import TraceError
from hexagent_gym.workload.workload import load_trace

LOADED = dict(cluster="asym-2p8d", trace="bfcl_v3", num_workflows=40, arrival_rate=40.0,
              load=None, workflow_split="eval")


def write(tmp_path, rows):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def wf(wid, **extra):
    return {"workflow_id": wid, "calls": [{"id": "0", "parents": [], "input_tokens": 10,
                                           "output_tokens": 5, "tool_latency_s": 0.0}], **extra}


# -- identity through loading -------------------------------------------------------------------

def test_application_ids_and_meta_survive_loading(tmp_path):
    bfcl = load_trace("bfcl_v3")
    first = bfcl.workflows[0]
    assert first.app_id == "bfcl_v3/multi_turn_base"
    assert first.meta["category"] == "multi_turn_base"
    assert first.prefix_key == str(first.meta["system_prefix_key"])
    assert {w.app_id for w in load_trace("lats").workflows} == {"lats"}
    assert {w.app_id for w in load_trace("sharegpt").workflows} == {"sharegpt"}
    path = write(tmp_path, [wf("a", app_id="mine"), wf("b", source="x", meta={"category": "c"}),
                            wf("c", source="x"), wf("d")])
    assert [w.app_id for w in load_trace(path).workflows] == ["mine", "x/c", "x", ""]


@pytest.mark.parametrize("row, field", [(wf("a", app_id=3), "app_id"),
                                        (wf("a", meta=[1]), "meta")])
def test_bad_identity_fields_name_the_line_and_field(tmp_path, row, field):
    path = write(tmp_path, [wf("ok"), row])
    with pytest.raises(TraceError, match=rf":2: field '{field}'"):
        load_trace(path)


def test_public_formats_declare_their_application():
    assert {w.app_id for w in load_trace("tests/fixtures/mooncake_small.jsonl").workflows} == {
        "mooncake"}
    assert sorted(w.app_id for w in load_trace("tests/fixtures/bailian_small.jsonl").workflows) \
        == ["bailian/file", "bailian/image", "bailian/search", "bailian/text"]


# -- the split ----------------------------------------------------------------------------------

def test_split_halves_are_disjoint_stable_and_cover_the_trace():
    trace = load_trace("bfcl_v3")
    train, evaluation = split_trace(trace, "train"), split_trace(trace, "eval")
    ids = {w.workflow_id for w in trace.workflows}
    train_ids = {w.workflow_id for w in train.workflows}
    eval_ids = {w.workflow_id for w in evaluation.workflows}
    assert train_ids.isdisjoint(eval_ids) and train_ids | eval_ids == ids
    assert 0.4 < len(train_ids) / len(ids) < 0.6
    wid = "bfcl_v3/multi_turn_base_0"  # by hand: the parity of its CRC-32
    assert split_of(wid) == ("train" if zlib.crc32(wid.encode()) % 2 == 0 else "eval")
    mixed_eval = {w.workflow_id for w in split_trace(load_trace("mixed"), "eval").workflows}
    assert {i for i in mixed_eval if i.startswith("bfcl_v3/")} <= eval_ids  # same half


def test_episodes_of_the_eval_half_never_hold_a_train_workflow():
    factory = EpisodeFactory(EpisodeConfig(**LOADED))
    work = factory.simulator(0).workload
    assert all(split_of(w.workflow_id) == "eval" for w in work.workflows)


def test_an_empty_half_is_a_clear_error(tmp_path):
    only = next(i for i in (f"w{k}" for k in range(50)) if split_of(i) == "train")
    path = write(tmp_path, [wf(only)])
    with pytest.raises(ConfigError, match="eval half of trace 't' is empty"):
        EpisodeFactory(EpisodeConfig(cluster="tiny-2p2d", trace=str(path), workflow_split="eval"))


# -- configuration errors -----------------------------------------------------------------------

@pytest.mark.parametrize("changes, message", [
    ({"horizon_predictor": "lerned"}, "Did you mean: `learned`"),
    ({"horizon_predictor": "learned", "horizon_warm_start": 2, "workflow_split": "all"},
     "overlaps the training workflows"),
    ({"horizon_predictor": "learned", "horizon_warm_start": 2, "workflow_split": "train"},
     "set workflow_split: eval"),
    ({"horizon_predictor": "oracle", "horizon_warm_start": 1, "workflow_split": "eval"},
     "needs a predictor that learns"),
    ({"horizon_predictor": "app-mean", "horizon_predictor_params": {"quantile": 0.5}},
     "app-mean horizon predictor takes gate, got quantile"),
    ({"horizon_predictor": "oracle", "horizon_predictor_params": {"gate": 0.5}},
     "oracle horizon predictor takes no parameters"),
    ({"horizon_predictor": "learned", "horizon_predictor_params": {"gate": float("nan")}},
     "gate must be a log-RMSE > 0 or None"),
    ({"horizon_predictor": "app-mean", "horizon_predictor_params": {"gate": True}},
     "gate must be a log-RMSE > 0 or None"),
    ({"horizon_predictor": "learned", "horizon_predictor_params": {"refit_growth": True}},
     "refit_growth must be a fraction > 0"),
    ({"horizon_predictor": "learned", "horizon_predictor_params": {"quantile": 1.5}},
     "quantile must be in"),
    ({"horizon_predictor": "learned", "horizon_predictor_params": {"trees": 5}},
     "unexpected keyword"),
    ({"workflow_split": "test"}, "workflow_split must be one of all, train, eval"),
    ({"horizon_warm_start": -1}, "horizon_warm_start must be an integer >= 0"),
])
def test_bad_horizon_settings_are_config_errors(changes, message):
    with pytest.raises(ConfigError, match=message):
        EpisodeConfig(**changes)


# -- what a predictor may read ------------------------------------------------------------------

class Spy(HorizonPredictor):
    """Checks, at every call, that only finished workflows are learned from (each once, in
    finish order, never after the present) and records what it was asked."""

    def __init__(self, sim_ref):
        self.sim_ref = sim_ref
        self.learned: list[int] = []
        self.asked = 0

    def learn(self, finished):
        sim = self.sim_ref[0]
        for w, rows in finished:
            assert w.done and 0.0 <= w.finish_t <= sim.now
            assert w.uid not in self.learned
            self.learned.append(w.uid)
            assert all(len(r) == 7 for r in rows)

    def predict(self, rows):
        self.asked += len(rows)
        for w, _ in rows:
            assert not w.done  # a waiting call's workflow is still running
        return [0.0] * len(rows)


def test_the_tracker_learns_only_from_finished_workflows_in_finish_order():
    factory = EpisodeFactory(EpisodeConfig(**LOADED))
    ref = [None]
    spy = Spy(ref)
    sim = factory.simulator(1, horizon_predictor=spy)
    ref[0] = sim
    sim.run()
    finished_before_last_decision = spy.learned
    assert spy.asked > 0 and finished_before_last_decision
    assert finished_before_last_decision == [w.uid for w in sim.finished][
        :len(finished_before_last_decision)]


def test_features_do_not_read_unrevealed_calls(tmp_path):
    """Two workflows that agree on their first two calls and differ after them (three more
    calls, longer outputs) have equal feature rows at every decision before the third call is
    revealed: a feature reading the future (a call count, a true length) would differ."""
    def chain(n, out):
        return [{"id": str(i), "parents": [str(i - 1)] if i else [], "input_tokens": 400 + i,
                 "output_tokens": out if i >= 2 else 30, "tool_latency_s": 0.5}
                for i in range(n)]

    rows = {}
    for name, calls in (("short", chain(2, 30)), ("long", chain(5, 300))):
        path = tmp_path / f"{name}.jsonl"
        path.write_text(json.dumps({"workflow_id": "w", "arrival_s": 0.0, "calls": calls}) + "\n")
        cfg = EpisodeConfig(cluster="tiny-2p2d", trace=str(path), num_workflows=None, load=None,
                            arrival_rate=None, length_predictor="oracle")
        sim = EpisodeFactory(cfg).simulator(0)
        seen = []
        dp = sim.run_until_decision()
        while dp is not None:
            w = dp.calls[0].workflow
            if w.num_done + len(w.open_calls) <= 2:
                seen.append(workflow_features(w, 0.0))
            while not dp.done:
                dp.pick(*_fallback(dp))
            dp = sim.run_until_decision()
        rows[name] = seen
    assert len(rows["short"]) >= 2  # the first call's decision and the second's
    assert rows["short"] == rows["long"][:len(rows["short"])]


def _fallback(dp):
    from hexagent_gym.planning.decisions import earliest_finish_pick

    return earliest_finish_pick(dp)


def test_app_mean_is_the_geometric_mean_of_finished_horizons_per_application():
    factory = EpisodeFactory(EpisodeConfig(**LOADED))
    sim = factory.simulator(3, horizon_predictor=AppMeanPredictor(gate=None))  # every forecast
    dp = sim.run_until_decision()
    checked = 0
    while dp is not None:
        logs = defaultdict(list)
        for w in sim.finished:
            logs[w.spec.app_id].append(math.log(w.horizon))
        every = [v for vs in logs.values() for v in vs]
        for c in dp.calls:
            w = c.workflow
            own = logs.get(w.spec.app_id) or every
            expect = math.exp(sum(own) / len(own)) if own else 0.0
            assert w.h_pred == pytest.approx(expect, rel=1e-12, abs=0.0)
            checked += 1
        while not dp.done:
            dp.pick(*_fallback(dp))
        dp = sim.run_until_decision()
    assert checked > 50


def test_learned_forecasts_are_bit_identical_for_a_seed_and_warm_start_uses_the_train_half():
    cfg = EpisodeConfig(**LOADED, horizon_predictor="learned", horizon_warm_start=1)
    runs = []
    for _ in range(2):
        factory = EpisodeFactory(cfg)
        rows = factory.horizon_rows("train", 1)
        assert rows and all(h > 0 for _, _, h in rows)
        sim = factory.simulator(4)
        seen = []
        dp = sim.run_until_decision()
        while dp is not None:
            seen.extend((c.workflow.uid, c.workflow.h_pred) for c in dp.calls)
            while not dp.done:
                dp.pick(*_fallback(dp))
            dp = sim.run_until_decision()
        runs.append(seen)
    assert runs[0] == runs[1] and any(h > 0 for _, h in runs[0])


def test_learned_beats_no_forecast_offline():
    """Fitted on one training episode, its forecasts of the eval half's final horizons are
    closer (log-RMSE) than the running horizon H_w(t) alone, at the same decisions."""
    factory = EpisodeFactory(EpisodeConfig(**{**LOADED, "num_workflows": 60},
                                           horizon_predictor="learned", horizon_warm_start=2,
                                           horizon_predictor_params={"gate": None}))
    sim = factory.simulator(5)
    err_pred, err_running = [], []
    dp = sim.run_until_decision()
    while dp is not None:
        for c in dp.calls:
            w = c.workflow
            err_pred.append(math.log(w.h_pred / w.horizon))
            err_running.append(math.log(max(w.h_est, 1e-9) / w.horizon))
        while not dp.done:
            dp.pick(*_fallback(dp))
        dp = sim.run_until_decision()
    rmse = lambda e: float(np.sqrt(np.mean(np.square(e))))  # noqa: E731
    assert rmse(err_pred) < 0.8 * rmse(err_running)


def test_make_horizon_predictor_names():
    assert make_horizon_predictor("none").predict([(None, [])]) == [0.0]
    with pytest.raises(ValueError, match="unknown horizon predictor 'orcale'"):
        make_horizon_predictor("orcale")


def test_a_trace_without_application_ids_falls_back_to_all_workflows():
    pred = AppMeanPredictor([("", 2.0), ("", 8.0)])
    assert pred.estimate("") == pytest.approx(4.0)
    assert pred.estimate("never-seen") == pytest.approx(4.0)  # every application together
    assert AppMeanPredictor().estimate("x") == 0.0


def test_tracker_refreshes_only_changed_workflows():
    class Count(HorizonPredictor):
        asked: list = []

        def predict(self, rows):
            self.asked.append(len(rows))
            return [1.0] * len(rows)

    factory = EpisodeFactory(EpisodeConfig(**LOADED))
    counter = Count()
    sim = factory.simulator(6, horizon_predictor=counter)
    assert isinstance(sim.horizon_tracker, HorizonTracker)
    dp = sim.run_until_decision()
    first = counter.asked[0]
    assert first == len({c.workflow.uid for c in dp.calls})
    sim.horizon_tracker.refresh(sim.finished, dp.calls)  # nothing changed: nothing asked
    assert len(counter.asked) == 1


def test_offline_error_by_hand():
    """Rows whose true H_w is twice the running horizon: H_w(t) is off by log 2 everywhere;
    app-mean is exact for a one-horizon application; the median forecast covers about half."""
    from hexagent_gym.futures.horizon_predictors import offline_error

    rng = np.random.default_rng(0)

    def rows(n):
        out = []
        for _ in range(n):
            h = float(rng.uniform(1.0, 10.0))
            out.append(("a", [500.0, 1.0, 1.0, 0.0, h, 0.0], 2.0 * h))
        out.append(("b", [500.0, 1.0, 1.0, 0.0, 3.0, 0.0], 6.0))
        return out

    err = offline_error(rows(300), rows(200))
    assert err["rows"] == 201
    assert err["rmse_running"] == pytest.approx(math.log(2.0))
    assert err["rmse_learned"] < 0.1 < err["rmse_app_mean"]
    assert 0.3 < err["coverage_0.5"] < 0.7
    assert err["coverage_0.1"] < err["coverage_0.5"] < err["coverage_0.9"]
