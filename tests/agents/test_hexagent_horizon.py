"""hexagent-horizon: HexAgent with the risk's denominator max(H_w(t), Ĥ_w)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hexagent_gym.agents.hexagent import HexAgentHorizon
from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.policy import make_policy, run_policy

LOADED = dict(cluster="asym-2p8d", trace="bfcl_v3", num_workflows=50, arrival_rate=40.0,
              load=None, workflow_split="eval")


def ratios(config: dict, policy, seed: int = 0) -> list[float]:
    sim = EpisodeFactory(EpisodeConfig(**config)).simulator(seed)
    policy = make_policy(policy) if isinstance(policy, str) else policy
    return run_policy(sim, policy).ratios.tolist()


def test_without_a_forecast_it_is_hexagent():
    for seed in (0, 1):
        assert ratios(LOADED, "hexagent-horizon", seed) == ratios(LOADED, "hexagent", seed)


def test_hexagent_ignores_the_forecast():
    assert ratios({**LOADED, "horizon_predictor": "oracle"}, "hexagent") == \
        ratios(LOADED, "hexagent")


def test_its_own_predictor_equals_the_episodes():
    own = ratios(LOADED, HexAgentHorizon(predictor="oracle"))
    assert own == ratios({**LOADED, "horizon_predictor": "oracle"}, "hexagent-horizon")
    assert own != ratios(LOADED, "hexagent")  # the forecast changes decisions here


def test_two_predictors_at_once_is_an_error():
    sim = EpisodeFactory(EpisodeConfig(**LOADED, horizon_predictor="oracle")).simulator(0)
    with pytest.raises(ValueError, match="drop the policy's predictor argument"):
        run_policy(sim, HexAgentHorizon(predictor="app-mean"))
    with pytest.raises(ValueError, match="needs predictor"):
        HexAgentHorizon(predictor_params={"quantile": 0.5})


def test_the_true_horizon_lowers_req99_in_a_loaded_cell():
    """The bound the forecasts aim at: asym-2p8d, BFCL-v3 50 @ 40/s (measured −42 % ± 7 on ten
    seeds); five seeds, every one better by a margin."""
    cfg = {**LOADED, "horizon_predictor": "oracle"}
    factory = EpisodeFactory(EpisodeConfig(**cfg))
    base = np.array([run_policy(factory.simulator(s), make_policy("hexagent")).req99
                     for s in range(5)])
    ours = np.array([run_policy(factory.simulator(s), make_policy("hexagent-horizon")).req99
                     for s in range(5)])
    assert (ours < base).sum() >= 4 and (1 - ours / base).mean() > 0.2


def test_compiled_and_python_rankings_agree():
    code = ("import json\n"
            "from hexagent_gym.episode import EpisodeConfig, EpisodeFactory\n"
            "from hexagent_gym.policy import make_policy, run_policy\n"
            f"cfg = EpisodeConfig(**{dict(LOADED, horizon_predictor='oracle')!r})\n"
            "sim = EpisodeFactory(cfg).simulator(3)\n"
            "r = run_policy(sim, make_policy('hexagent-horizon'))\n"
            "print(json.dumps(r.ratios.tolist()))\n")
    out = {}
    for pure in ("0", "1"):
        env = {**os.environ, "HEXAGENT_GYM_PURE_PYTHON": pure}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env)
        assert proc.returncode == 0, proc.stderr
        out[pure] = json.loads(proc.stdout)
    assert out["0"] == out["1"]


def _shown(*apps_and_forecasts):
    """A decision point showing one call per (application id, forecast) workflow, each with a
    running horizon of 1 s."""
    from types import SimpleNamespace as NS
    return NS(calls=[NS(workflow=NS(h_est=1.0, h_pred=h, spec=NS(app_id=app)))
                     for app, h in apps_and_forecasts])


def test_a_decision_with_an_untrusted_application_ranks_every_workflow_by_its_running_horizon():
    from types import SimpleNamespace as NS

    from hexagent_gym.futures.horizon_tracker import MIN_ROWS, ForecastGate

    gate = ForecastGate(0.5)
    gate.record("good", [0.0] * MIN_ROWS, 0.1)  # error 0.1: trusted
    gate.record("bad", [0.0] * MIN_ROWS, 1.0)  # error 1.0: the gate leaves it to H_w(t)
    policy = HexAgentHorizon()
    policy._sim = NS(horizon_tracker=NS(gate=gate), finished=[])
    # only trusted applications: each workflow's max(H_w(t), Ĥ_w)
    assert policy.horizons(_shown(("good", 3.0), ("good", 0.0))) == [3.0, 1.0]
    # one untrusted workflow in the decision: one scale, the running horizon, for all
    assert policy.horizons(_shown(("good", 3.0), ("bad", 0.0))) == [1.0, 1.0]
    # one_scale=False (the learned scheduler's teacher): each workflow on its own
    policy = HexAgentHorizon(one_scale=False)
    policy._sim = NS(horizon_tracker=NS(gate=gate), finished=[])
    assert policy.horizons(_shown(("good", 3.0), ("bad", 0.0))) == [3.0, 1.0]
    with pytest.raises(ValueError, match="one_scale must be true or false"):
        HexAgentHorizon(one_scale="yes")
    # no tracker (predictor none): the forecasts, all 0, leave the running horizon
    policy = HexAgentHorizon()
    policy._sim = NS(horizon_tracker=None, finished=[])
    assert policy.horizons(_shown(("good", 0.0))) == [1.0]
