"""The Ray backend: same records as the serial backend, failures kept apart, resume after an
interrupt, the CLI. Skipped when ray is not installed (pip install "hexagent-gym[distributed]")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from hexagent_gym.experiments import (  # noqa: E402
    CELLS_FILE,
    FAILURES_FILE,
    CellError,
    evaluate,
    format_failures,
    read_cells,
    write_results,
)
from tests.experiments.tiny_grid import tiny_experiment as tiny  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def without_timing(records):
    return [{k: v for k, v in r.items() if k != "timing"} for r in records]


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    """One local Ray instance (2 CPUs) for the module; evaluate() uses it and leaves it up."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="warning")
    yield
    ray.shutdown()


def test_ray_matches_the_serial_backend_exactly(tmp_path):
    exp = tiny(traces=("bfcl_v3", "sharegpt"))  # two factory groups, 8 cells
    serial = evaluate(exp, tmp_path / "serial", progress=False, timing=False)
    for chunk in (1, 0):  # one cell per task, whole factory groups per task
        out = tmp_path / f"ray{chunk}"
        dist = evaluate(exp, out, progress=False, timing=False, backend="ray", chunk_size=chunk)
        assert dist.backend == "ray" and dist.complete and dist.computed == 8
        assert dist.records == serial.records
        write_results(serial, tmp_path / "serial")
        write_results(dist, out)
        for name in ("results.json", "tables.md"):
            assert (out / name).read_bytes() == (tmp_path / "serial" / name).read_bytes()
        assert len((out / CELLS_FILE).read_text().splitlines()) == 8
    # Mean ± 95% CI over the two seeds shows in the Ray run's tables too.
    table = (tmp_path / "ray0/tables.md").read_text()
    assert "mean ± 95% CI" in table and " ± " in table.split("## req99")[1]
    # With wall-clock timings on, everything else is still identical.
    timed = evaluate(exp, None, progress=False, backend="ray")
    assert all("timing" in r for r in timed.records)
    assert without_timing(timed.records) == serial.records


def test_a_failing_cell_is_reported_and_the_others_are_kept(tmp_path):
    # llf's constructor rejects the argument inside the Ray worker: both llf cells fail.
    exp = tiny(policies=("hexagent", "llf", "fcfs"), policy_kwargs={"llf": {"bogus": 1}})
    ev = evaluate(exp, tmp_path, progress=False, timing=False, backend="ray", chunk_size=2)
    assert not ev.complete and ev.computed == 4 and len(ev.records) == 4
    assert [f.cell["policy"] for f in ev.failures] == ["llf", "llf"]
    assert [f.cell["episode"]["seed"] for f in ev.failures] == [0, 1]
    for f in ev.failures:
        assert f.cell["policy_kwargs"] == {"bogus": 1}
        assert f.error.startswith("TypeError:") and "bogus" in f.error
        assert "Traceback" in f.traceback
    # The good cells are the serial backend's records, on disk and in the result.
    good = evaluate(tiny(policies=("hexagent", "fcfs")), None, progress=False, timing=False)
    assert ev.records == good.records
    assert set(read_cells(tmp_path / CELLS_FILE)) == {r["key"] for r in good.records}
    lines = [json.loads(x) for x in (tmp_path / FAILURES_FILE).read_text().splitlines()]
    # the file is appended as chunks finish (completion order), the result keeps grid order
    assert sorted(x["key"] for x in lines) == sorted(f.key for f in ev.failures)
    report = format_failures(ev.failures, 6)
    assert report.startswith("2 of 6 cells failed") and report.count("FAILED llf") == 2
    assert '"policy_kwargs": {"bogus": 1}' in report and "seed 1" in report
    # The tables say what is missing.
    write_results(ev, tmp_path)
    assert "**Incomplete**: 2 cells failed" in (tmp_path / "tables.md").read_text()
    assert len(json.loads((tmp_path / "results.json").read_text())["failures"]) == 2
    # Resuming retries only the failed cells; fail_fast stops at the first one.
    again = evaluate(exp, tmp_path, resume=True, progress=False, timing=False, backend="ray")
    assert (again.computed, again.reused, len(again.failures)) == (0, 4, 2)
    with pytest.raises(CellError, match="bogus"):
        evaluate(exp, None, progress=False, backend="ray", fail_fast=True)


def test_an_interrupted_ray_run_resumes(tmp_path):
    exp = tiny(traces=("bfcl_v3", "sharegpt"))
    seen = []

    def interrupt_after_three(record):
        seen.append(record["key"])
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        evaluate(exp, tmp_path, progress=False, timing=False, backend="ray", chunk_size=1,
                 on_record=interrupt_after_three)
    path = tmp_path / CELLS_FILE
    assert len(path.read_text().splitlines()) == 3
    with path.open("a") as f:  # and a torn last line, as if killed mid-write
        f.write('{"schema": 1, "key": "')
    resumed = evaluate(exp, tmp_path, resume=True, progress=False, timing=False, backend="ray")
    assert (resumed.computed, resumed.reused) == (5, 3)
    serial = evaluate(exp, None, progress=False, timing=False)
    assert resumed.records == serial.records
    assert len(read_cells(path)) == 8


def test_cli_ray_backend(tmp_path):
    args = ["--clusters", "tiny-2p2d", "--traces", "bfcl_v3", "--num-workflows", "6",
            "--load", "1.0", "--policies", "hexagent,fcfs", "--seeds", "0,1", "--quiet"]
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/evaluate.py"), *args,
                           "--out", str(tmp_path / "ray"), "--backend", "ray", "--workers", "2"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "on Ray (local instance)" in proc.stderr and "4 cells run" in proc.stderr
    assert "| hexagent | fcfs |" in proc.stdout and " ± " in proc.stdout
    cells = json.loads((tmp_path / "ray/results.json").read_text())["cells"]
    serial = evaluate(tiny(), None, progress=False, timing=False)
    assert without_timing(cells) == serial.records


def test_an_unreachable_address_fails_fast_and_keeps_the_output(tmp_path):
    (tmp_path / CELLS_FILE).write_text("kept\n")
    with pytest.raises(ConnectionError, match="cannot reach a Ray head at 127.0.0.1:9"):
        evaluate(tiny(), tmp_path, progress=False, backend="ray", address="127.0.0.1:9")
    assert (tmp_path / CELLS_FILE).read_text() == "kept\n"


def test_tune_sweep_smoke(tmp_path):
    """scripts/tune.py end to end: one tiny trial runs train.py and logs to TensorBoard."""
    pytest.importorskip("ray.tune")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts/tune.py"), "--num-samples", "1",
         "--total-timesteps", "128", "--num-workflows", "8", "--workers", "1", "--poll", "1",
         "--logdir", str(tmp_path), "--", "--n-envs", "1", "--batch-size", "64"],
        capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    sweep = json.loads((tmp_path / "ppo_sweep/sweep.json").read_text())
    (trial,) = sweep["trials"]
    assert trial["error"] is None and trial["best_req99"] >= 1.0
    train = Path(trial["path"]) / "train"
    assert list(train.glob("events.out.tfevents.*")) and (train / "run.json").is_file()
    assert "| trial | lr | n_steps |" in proc.stdout
