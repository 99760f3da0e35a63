"""scripts/evaluate.py's command line: public traces replay their own timestamps with --replay,
and every name is checked before any cell runs (no output, no work for a typo)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hexagent_gym.scripts import evaluate
from hexagent_gym.workload.workload import load_trace

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MOONCAKE = FIXTURES / "mooncake_small.jsonl"


def run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = evaluate.main(argv)
    except SystemExit as exc:  # argparse errors
        code = exc.code
    return code, capsys.readouterr().err


def test_replay_runs_every_row_at_its_own_timestamp(tmp_path, capsys):
    code, err = run(["--traces", str(MOONCAKE), "--replay", "--policies", "fcfs",
                     "--seeds", "0", "--out", str(tmp_path), "--quiet"], capsys)
    assert code == 0, err
    assert "note:" not in err
    (cell,) = json.loads((tmp_path / "results.json").read_text())["cells"]
    trace = load_trace(str(MOONCAKE))
    assert cell["cell"]["episode"]["num_workflows"] is None
    assert cell["cell"]["episode"]["load"] is None
    assert cell["cell"]["episode"]["arrival_rate"] is None
    # every row once, in arrival_s order (ties keep file order)
    order = sorted(range(len(trace.workflows)), key=lambda i: trace.workflows[i].arrival_s)
    assert cell["workflows"]["trace_index"] == order
    assert len(cell["workflows"]["ratio"]) == len(trace.workflows)


def test_replay_with_num_workflows_takes_the_first_rows(tmp_path, capsys):
    code, err = run(["--traces", str(MOONCAKE), "--replay", "--num-workflows", "5",
                     "--policies", "fcfs", "--seeds", "0", "--out", str(tmp_path), "--quiet"],
                    capsys)
    assert code == 0, err
    (cell,) = json.loads((tmp_path / "results.json").read_text())["cells"]
    trace = load_trace(str(MOONCAKE))
    order = sorted(range(len(trace.workflows)), key=lambda i: trace.workflows[i].arrival_s)
    assert cell["workflows"]["trace_index"] == order[:5]


def test_sampling_a_timestamped_trace_says_so(tmp_path, capsys):
    code, err = run(["--traces", str(MOONCAKE), "--policies", "fcfs", "--seeds", "0",
                     "--num-workflows", "5", "--out", str(tmp_path), "--quiet"], capsys)
    assert code == 0, err
    assert "has its own arrival times" in err and "--replay" in err


@pytest.mark.parametrize("argv, message", [
    (["--clusters", "hetero1"], "--clusters: unknown cluster 'hetero1'"),
    (["--traces", "bfcl_v9"], "--traces:"),
    (["--policies", "hexagnet"], "unknown policy 'hexagnet'"),
    (["--traces", "bfcl_v3", "--replay"], "--replay: trace 'bfcl_v3'"),
    (["--traces", str(MOONCAKE), "--replay", "--load", "0.8"], "drop --load"),
    (["--load", "none"], "use --replay"),
])
def test_bad_names_fail_before_any_work(argv, message, tmp_path, capsys):
    out = tmp_path / "out"
    code, err = run([*argv, "--out", str(out), "--quiet"], capsys)
    assert code == 2
    assert message in err, err
    assert "Traceback" not in err
    assert not out.exists()  # nothing ran, nothing was written
