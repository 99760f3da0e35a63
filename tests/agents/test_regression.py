"""The CI quality check flags crashes and Req99 regressions, and only those."""

from __future__ import annotations

import math

from hexagent_gym.agents.regression import (
    CaseResult,
    check,
    format_table,
    load_baseline,
    save_baseline,
)


def case(policy, req99, error=""):
    return CaseResult("c", "t", 10, 1.0, policy, req99, req99, 0.1, error)


def test_regression_beyond_tolerance_fails_and_within_passes():
    base = {"c/t/10@1/s": 2.0}
    assert check([case("hexagent", 2.03)], base, tolerance=0.02) == []
    problems = check([case("hexagent", 2.05)], base, tolerance=0.02)
    assert len(problems) == 1 and "regressed on c/t/10@1/s: 2.0500 > baseline 2.0000" in problems[0]
    assert check([case("hexagent", 1.5)], base) == []  # improvements pass
    assert check([case("fcfs", 9.0)], base) == []  # only the reference is gated


def test_crash_and_missing_baseline_are_reported():
    problems = check([case("atlas", math.nan, "ValueError: boom"), case("hexagent", 1.0)], {})
    assert any("atlas crashed on c/t/10@1/s: ValueError: boom" in p for p in problems)
    assert any("no baseline for c/t/10@1/s" in p for p in problems)
    assert "crashed" in format_table([case("atlas", math.nan, "ValueError: boom")])


def test_baseline_round_trip(tmp_path):
    path = tmp_path / "b.json"
    save_baseline(path, [case("hexagent", 1.25), case("fcfs", 3.0)])
    assert load_baseline(path) == {"c/t/10@1/s": 1.25}
    assert load_baseline(tmp_path / "missing.json") == {}
