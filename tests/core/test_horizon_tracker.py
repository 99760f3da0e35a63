"""The horizon tracker's bookkeeping skips only work whose answer it already has: at every
decision of real episodes each shown workflow's ``h_pred`` equals the forecast gated afresh
(a gate rebuilt from the same error sums, no cached judgement), and the compiled change test
equals its Python twin call by call."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.futures import horizon_tracker as ht
from hexagent_gym.futures.horizon_tracker import ForecastGate, forecast_stale_python
from hexagent_gym.planning import kernels
from hexagent_gym.policy import make_policy, run_policy

# Mixed holds applications the gate distrusts and judges by family; BFCL-v3 at 40/s keeps many
# workflows waiting while the errors move
EPISODES = [
    dict(cluster="hetero-1", trace="bfcl_v3", num_workflows=160, arrival_rate=40.0, load=None),
    dict(cluster="hetero-2", trace="mixed", num_workflows=80, arrival_rate=10.0, load=None),
]


def fresh_gate(gate: ForecastGate) -> ForecastGate:
    """A gate with ``gate``'s error sums and nothing judged yet."""
    return ForecastGate(gate.limit, {k: (s[0], s[1]) for k, s in gate._sq.items()})


@pytest.mark.parametrize("config", EPISODES, ids=lambda c: c["trace"])
def test_every_shown_forecast_is_gated_as_a_fresh_gate_would(monkeypatch, config):
    refresh = ht.HorizonTracker.refresh
    seen = {"checked": 0}

    def checked(self, finished, calls):
        refresh(self, finished, calls)
        reference = fresh_gate(self.gate)
        for c in calls:
            wf = c.workflow
            t = self._tracked[wf.uid]
            assert wf.h_pred == reference.use(wf.spec.app_id, t.h, wf.h_est)
            seen["checked"] += 1

    monkeypatch.setattr(ht.HorizonTracker, "refresh", checked)
    factory = EpisodeFactory(EpisodeConfig(**config, workflow_split="eval",
                                           horizon_predictor="learned", horizon_warm_start=2))
    sim = factory.simulator(3)
    run_policy(sim, make_policy("hexagent-horizon"))
    gate = sim.horizon_tracker.gate
    # the episode moved judgements (else the check above could not catch a stale one)
    assert seen["checked"] > 1000 and sum(gate.app_version.values()) > 0


@pytest.mark.parametrize("config", EPISODES, ids=lambda c: c["trace"])
def test_a_moved_judgement_clears_its_workflows_stamps(monkeypatch, config):
    """Where a record moves an application's judgement, each of its tracked workflows is either
    judged again at that decision (shown) or left with a cleared stamp, so that it is judged
    again whenever it is next shown, whether or not it progressed."""
    refresh = ht.HorizonTracker.refresh
    seen = {"cleared": 0}

    def checked(self, finished, calls):
        versions = dict(self.gate.app_version)
        refresh(self, finished, calls)
        shown = {c.workflow.uid for c in calls}
        for app, v in self.gate.app_version.items():
            if v != versions.get(app, 0):
                for uid, wf in self._by_app.get(app, {}).items():
                    if uid not in shown:
                        assert wf.forecast_stamp == -1
                        seen["cleared"] += 1

    monkeypatch.setattr(ht.HorizonTracker, "refresh", checked)
    factory = EpisodeFactory(EpisodeConfig(**config, workflow_split="eval",
                                           horizon_predictor="learned", horizon_warm_start=2))
    run_policy(factory.simulator(3), make_policy("hexagent-horizon"))
    assert seen["cleared"] > 0


@pytest.mark.skipif(not kernels.AVAILABLE, reason="the compiled kernels are not built")
@pytest.mark.parametrize("config", EPISODES, ids=lambda c: c["trace"])
def test_compiled_change_test_equals_python_at_every_decision(monkeypatch, config):
    compiled = kernels.forecast_stale
    calls_seen = {"n": 0, "listed": 0}

    def both(calls, epoch):
        before = [c.workflow.forecast_stamp for c in calls]
        slow = forecast_stale_python(calls, epoch)
        expected = [c.workflow.forecast_stamp for c in calls]
        for c, stamp in zip(calls, before, strict=True):
            c.workflow.forecast_stamp = stamp
        fast = compiled(calls, epoch)
        assert fast == slow
        assert [c.workflow.forecast_stamp for c in calls] == expected
        calls_seen["n"] += len(calls)
        calls_seen["listed"] += len(fast)
        return fast

    monkeypatch.setattr(kernels, "forecast_stale", both)
    factory = EpisodeFactory(EpisodeConfig(**config, workflow_split="eval",
                                           horizon_predictor="learned", horizon_warm_start=2))
    run_policy(factory.simulator(2), make_policy("hexagent"))
    assert calls_seen["n"] > 1000 and 0 < calls_seen["listed"] < calls_seen["n"]


def toy_call(uid, done, open_calls):
    wf = SimpleNamespace(uid=uid, num_done=done, open_calls=[None] * open_calls,
                         forecast_stamp=-1)
    return SimpleNamespace(workflow=wf)


@pytest.mark.parametrize("impl", ["python", "compiled"])
def test_change_test_by_hand(impl):
    if impl == "compiled" and not kernels.AVAILABLE:
        pytest.skip("the compiled kernels are not built")
    find = forecast_stale_python if impl == "python" else kernels.forecast_stale
    a, b = toy_call(1, 2, 1), toy_call(2, 0, 1)
    a2 = SimpleNamespace(workflow=a.workflow)  # a second call of a's workflow
    assert find([a, b, a2], 0) == [0, 1]  # a's second call: already listed
    assert (a.workflow.forecast_stamp, b.workflow.forecast_stamp) == (5, 1)  # 2 * done + open
    assert find([a, b], 0) == []
    a.workflow.num_done = 3  # a finished call (open stays 1 here): progress 7
    assert find([b, a], 0) == [1] and a.workflow.forecast_stamp == 7
    b.workflow.forecast_stamp = -1  # its application's judgement moved: cleared
    assert find([a, b], 0) == [1] and b.workflow.forecast_stamp == 1
    assert find([a, b], 1) == [0, 1]  # a new model: everything again
    assert (a.workflow.forecast_stamp, b.workflow.forecast_stamp) == (7 + (1 << 32),
                                                                      1 + (1 << 32))


@pytest.mark.skipif(not kernels.AVAILABLE, reason="the compiled kernels are not built")
def test_compiled_change_test_errors_name_the_problem():
    call = toy_call(1, 0, 1)
    with pytest.raises(OverflowError, match="epoch"):
        kernels.forecast_stale([call], -1)
    bad = copy.deepcopy(call)
    bad.workflow.num_done = 1.5
    with pytest.raises(TypeError, match="num_done must be an int"):
        kernels.forecast_stale([bad], 0)
    with pytest.raises(TypeError, match="calls must be a list or tuple"):
        kernels.forecast_stale(iter([call]), 0)
    with pytest.raises(OverflowError, match="62 bits"):
        kernels.forecast_stale([call], 1 << 30)
    with pytest.raises(TypeError, match="takes 2 arguments"):
        kernels.forecast_stale([call], 0, {})
