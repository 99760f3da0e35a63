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


@pytest.mark.skipif(not kernels.AVAILABLE, reason="the compiled kernels are not built")
@pytest.mark.parametrize("config", EPISODES, ids=lambda c: c["trace"])
def test_compiled_change_test_equals_python_at_every_decision(monkeypatch, config):
    compiled = kernels.forecast_stale
    calls_seen = {"n": 0}

    def both(calls, stamp, epoch, versions):
        before = dict(stamp)
        slow = forecast_stale_python(calls, dict(before), epoch, versions)
        fast = compiled(calls, stamp, epoch, versions)
        assert fast == slow
        expected = dict(before)
        forecast_stale_python(calls, expected, epoch, versions)
        assert stamp == expected
        calls_seen["n"] += len(calls)
        return fast

    monkeypatch.setattr(kernels, "forecast_stale", both)
    factory = EpisodeFactory(EpisodeConfig(**config, workflow_split="eval",
                                           horizon_predictor="learned", horizon_warm_start=2))
    run_policy(factory.simulator(2), make_policy("hexagent"))
    assert calls_seen["n"] > 1000


def toy_call(uid, done, open_calls, app):
    wf = SimpleNamespace(uid=uid, num_done=done, open_calls=[None] * open_calls,
                         spec=SimpleNamespace(app_id=app))
    return SimpleNamespace(workflow=wf)


@pytest.mark.parametrize("impl", ["python", "compiled"])
def test_change_test_by_hand(impl):
    if impl == "compiled" and not kernels.AVAILABLE:
        pytest.skip("the compiled kernels are not built")
    find = forecast_stale_python if impl == "python" else kernels.forecast_stale
    a, b, a2 = toy_call(1, 2, 1, "x"), toy_call(2, 0, 1, "y"), toy_call(1, 2, 1, "x")
    stamp: dict[int, int] = {}
    assert find([a, b, a2], stamp, 0, {}) == [0, 1]  # a's second call: already listed
    assert stamp == {1: 5, 2: 1}  # 2 * done + open
    assert find([a, b], stamp, 0, {}) == []
    a.workflow.num_done = 3  # a finished call (open stays 1 here): progress 7
    assert find([b, a], stamp, 0, {}) == [1] and stamp[1] == 7
    assert find([a, b], stamp, 0, {"y": 1}) == [1] and stamp[2] == 1 + (1 << 32)
    assert find([a, b], stamp, 1, {"y": 1}) == [0, 1]  # a new model: everything again
    assert stamp == {1: 7 + (1 << 32), 2: 1 + (2 << 32)}


@pytest.mark.skipif(not kernels.AVAILABLE, reason="the compiled kernels are not built")
def test_compiled_change_test_errors_name_the_problem():
    call = toy_call(1, 0, 1, "x")
    with pytest.raises(TypeError, match="stamp and app_version must be dicts"):
        kernels.forecast_stale([call], [], 0, {})
    with pytest.raises(OverflowError, match="epoch"):
        kernels.forecast_stale([call], {}, -1, {})
    bad = copy.deepcopy(call)
    bad.workflow.num_done = 1.5
    with pytest.raises(TypeError, match="num_done must be an int"):
        kernels.forecast_stale([bad], {}, 0, {})
    with pytest.raises(TypeError, match="calls must be a list or tuple"):
        kernels.forecast_stale(iter([call]), {}, 0, {})
    with pytest.raises(OverflowError, match="62 bits"):
        kernels.forecast_stale([call], {}, 1 << 30, {})
