"""scripts/hexagent_variants.py: one-knob variants of HexAgent's risk rank."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from hexagent_gym.envs.pd_cluster_env import PDClusterEnv
from hexagent_gym.scripts.hexagent_variants import RiskVariant, main, parse_variant


def _stub_dp(arrival, h_est, best, now=10.0):
    """A decision of three waiting calls with hand-set risks (best_pair: slot → (slot, 0, Δ))."""
    return SimpleNamespace(
        calls=[object()] * len(best), now=now, picked=[False] * len(best),
        min_delta=np.array(best, dtype=float),
        batch=SimpleNamespace(arrival=np.array(arrival, dtype=float),
                              h_est=np.array(h_est, dtype=float)),
        best_pair=lambda slot: (slot, 0, best[slot]))


def test_knobs_change_the_rank_as_written():
    # elapsed 10 − a: [8, 7.5, 5]; R = (elapsed + Δ)/H = [(8+2)/10, (7.5+1.4)/10, (5+0)/10]
    dp = _stub_dp(arrival=[2.0, 2.5, 5.0], h_est=[10.0, 10.0, 10.0], best=[2.0, 1.4, 0.0])
    assert RiskVariant().pick(dp) == (0, 0, 0)  # R = [1.0, 0.89, 0.5]
    # within 5 % of the top only slot 0; within 15 % slots 0 and 1, and 1 is shorter (1.4 < 2)
    assert RiskVariant(tie=0.05).pick(dp)[0] == 0
    assert RiskVariant(tie=0.15).pick(dp)[0] == 1
    # twice the weight on elapsed time: R = [1.8, 1.64, 1.0]; weight 0: R = Δ/H = [0.2, 0.14, 0]
    assert RiskVariant(elapsed=2.0).pick(dp)[0] == 0
    dp = _stub_dp(arrival=[2.0, 2.5, 5.0], h_est=[10.0, 10.0, 10.0], best=[1.0, 1.4, 0.0])
    assert RiskVariant().pick(dp)[0] == 0  # R = [0.9, 0.89, 0.5]
    assert RiskVariant(elapsed=0.0).pick(dp)[0] == 1  # R = [0.1, 0.14, 0.0]
    # the horizon's power: H differs, so β moves the rank
    dp = _stub_dp(arrival=[0.0, 0.0, 9.0], h_est=[20.0, 5.0, 1.0], best=[0.0, 0.0, 0.5])
    # β = 1: R = [0.5, 2.0, 1.5] → slot 1; β = 0: R = elapsed + Δ = [10, 10, 1.5] → slot 0
    assert RiskVariant().pick(dp)[0] == 1
    assert RiskVariant(horizon=0.0).pick(dp)[0] == 0


def test_default_knobs_pick_exactly_as_hexagent_and_others_do_not():
    env = PDClusterEnv(cluster="hetero-1", trace="bfcl_v3", num_workflows=40,
                       arrival_rate=300.0, load=None, seed=0)
    ref = env.rollout("hexagent", seed=1).episode
    same = env.rollout(RiskVariant(), seed=1).episode
    assert same.ratios.tolist() == ref.ratios.tolist()
    other = env.rollout(RiskVariant(elapsed=0.0), seed=1).episode
    assert other.ratios.tolist() != ref.ratios.tolist()


@pytest.mark.parametrize("text, message", [
    ("speed=2", "knob one of elapsed, horizon, tie"),
    ("elapsed", "knob one of"),
    ("horizon=fast", "'fast' is not a number"),
    ("tie=-1", "tie must be >= 0"),
])
def test_bad_variants_are_refused_with_the_valid_knobs(text, message):
    with pytest.raises(ValueError, match=message):
        parse_variant(text)


def test_main_prints_a_paired_table(capsys):
    assert main(["--mixture", "bfcl-mix", "--episodes", "3", "--num-workflows", "8",
                 "--variants", "elapsed=1,tie=0.1"]) == 0
    out = capsys.readouterr().out
    assert "mixture bfcl-mix, 8 workflows, 3 paired episodes" in out
    assert "| elapsed=1 | 0.00 ± 0.00 % | 0/3 |" in out
    assert "| tie=0.1 |" in out
