"""The per-cell timeout: a cell that runs too long is recorded as failed (naming the timeout),
its worker is killed and replaced, and the grid goes on; the value is checked up front."""

from __future__ import annotations

import json
import math
import os
import subprocess
import time

import pytest

from hexagent_gym.config import ConfigError
from hexagent_gym.experiments import FAILURES_FILE, PolicySpec, evaluate, read_cells
from hexagent_gym.experiments.chunks import process_factories
from hexagent_gym.experiments.worker_pool import check_cell_timeout
from hexagent_gym.scripts.evaluate import main
from tests.experiments.slow_policy import (
    EVALUATE,
    ROOT,
    SLEEP_ENV,
    TINY_FLAGS,
    children,
    registered,
)
from tests.experiments.tiny_grid import tiny_experiment

STUCK = PolicySpec("sleepy", "stuck", {"seconds": 600})


@pytest.fixture
def warm_factory():
    """Build the tiny grid's factory in this process, so forked workers start with it: the test
    times the cells, not a factory build on a busy machine (which has a budget of its own)."""
    process_factories().get(tiny_experiment().cells()[0].factory_config)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_stuck_cell_times_out_and_the_grid_goes_on(tmp_path, monkeypatch, warm_factory,
                                                      workers):
    registered(monkeypatch)
    exp = tiny_experiment(policies=(STUCK, "fcfs"))
    before = set(children(os.getpid()))  # e.g. a Ray instance an earlier test left running
    start = time.monotonic()
    ev = evaluate(exp, tmp_path, progress=False, timing=False, workers=workers,
                  cell_timeout=2.0)
    assert time.monotonic() - start < 60
    assert [(f.cell["label"], f.cell["episode"]["seed"]) for f in ev.failures] == [
        ("stuck", 0), ("stuck", 1)]
    for f in ev.failures:
        assert f.error.startswith("CellTimeout: the cell ran longer than the cell timeout of 2 s")
        assert "its worker process was killed" in f.error
    lines = [json.loads(x) for x in (tmp_path / FAILURES_FILE).read_text().splitlines()]
    assert sorted(x["key"] for x in lines) == sorted(f.key for f in ev.failures)
    fcfs = evaluate(tiny_experiment(policies=("fcfs",)), None, progress=False, timing=False)
    assert ev.records == fcfs.records and len(read_cells(tmp_path / "cells.jsonl")) == 2
    assert set(children(os.getpid())) - before == set()  # every worker gone


def test_a_worker_that_dies_fails_its_cell_and_the_rest_run_on(tmp_path, monkeypatch,
                                                               warm_factory):
    registered(monkeypatch)
    crash = PolicySpec("sleepy", "crash", {"exit_code": 3})
    exp = tiny_experiment(policies=(crash, "fcfs"), seeds=(0, 1, 2))
    ev = evaluate(exp, tmp_path, progress=False, timing=False, workers=2)
    assert [f.cell["label"] for f in ev.failures] == ["crash"] * 3
    assert all(f.error == "WorkerDied: the worker process running this cell died (exit "
               "status 3)" for f in ev.failures)
    fcfs = evaluate(tiny_experiment(policies=("fcfs",), seeds=(0, 1, 2)), None, progress=False,
                    timing=False)
    assert ev.records == fcfs.records


def test_a_generous_timeout_changes_no_record():
    exp = tiny_experiment(traces=("bfcl_v3", "sharegpt"))
    serial = evaluate(exp, None, progress=False, timing=False)
    for workers in (1, 2):
        timed = evaluate(exp, None, progress=False, timing=False, workers=workers,
                         cell_timeout=300)
        assert timed.records == serial.records and not timed.failures


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, True, "5"])
def test_the_timeout_must_be_a_finite_positive_number(bad):
    with pytest.raises(ConfigError, match=r"cell_timeout must be a finite number of seconds > 0"):
        evaluate(tiny_experiment(), None, progress=False, cell_timeout=bad)
    with pytest.raises(ConfigError, match=r"^cell_timeout_s must be"):
        check_cell_timeout(bad)


def test_the_timeout_is_for_the_local_backend():
    with pytest.raises(ValueError, match="cell_timeout applies to backend='local' only"):
        evaluate(tiny_experiment(), None, progress=False, backend="ray", cell_timeout=5)


@pytest.mark.parametrize("flag", ["0", "-3", "nan", "inf"])
def test_cli_rejects_a_bad_timeout(flag, capsys):
    with pytest.raises(SystemExit) as info:
        main([*TINY_FLAGS, "--cell-timeout", flag])
    assert info.value.code == 2
    assert "--cell-timeout must be a finite number of seconds > 0" in capsys.readouterr().err


def test_cli_cell_timeout_fails_the_stuck_cells_and_exits_1(tmp_path):
    env = {**os.environ, SLEEP_ENV: "600"}
    proc = subprocess.run([*EVALUATE, *TINY_FLAGS, "--policies", "sleepy,fcfs", "--seeds", "0,1",
                           "--out", str(tmp_path), "--cell-timeout", "3", "--workers", "2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "2 of 4 cells failed" in proc.stderr
    assert proc.stderr.count("error: CellTimeout: the cell ran longer than the cell timeout "
                             "of 3 s") == 2
    assert proc.stderr.count("FAILED sleepy ") == 2
    assert "| fcfs |" in proc.stdout  # the cells that finished are tabulated
