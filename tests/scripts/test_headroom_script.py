"""scripts/headroom.py: the paired Req99 table (headroom and held-out learner tables)."""

from __future__ import annotations

from hexagent_gym.scripts.headroom import headroom_rows


def _cell(policy: str, seed: int, req99: float, label: str = "") -> dict:
    cell = {"policy": policy, "episode": {"cluster": "c", "trace": "t", "seed": seed}}
    if label:
        cell["label"] = label
    return {"cell": cell, "metrics": {"req99": req99}}


def test_paired_reductions_per_seed_and_labels():
    cells = [_cell("hexagent", 0, 1.25), _cell("hexagent", 1, 1.0),
             _cell("learned", 0, 1.0, label="mine"), _cell("learned", 1, 1.0, label="mine"),
             _cell("fcfs", 0, 2.0), _cell("fcfs", 1, 3.0), _cell("atlas", 0, 1.5),
             _cell("atlas", 1, 1.5)]
    lines = headroom_rows({str(i): c for i, c in enumerate(cells)}, "hexagent", ("mine", "x"))
    assert lines[0] == ("| cluster | trace | hexagent | mine | x | best baseline | mine vs "
                        "hexagent | x vs hexagent |")
    row = lines[2].split(" | ")
    assert row[2].startswith("1.125 ±") and row[3].startswith("1.000 ±")
    assert row[4] == "not run" and row[5].startswith("atlas 1.500")
    assert row[6].startswith("10.0 ±")  # mean of 20 % (seed 0) and 0 % (seed 1)
    assert row[7] == "– |"


def test_no_reference_cells_gives_only_the_header():
    assert len(headroom_rows({"a": _cell("fcfs", 0, 2.0)})) == 2
