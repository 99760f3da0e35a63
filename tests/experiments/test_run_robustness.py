"""The runner's output directory: resume validates every record and quarantines the bad ones
with a warning, and one run at a time writes to a directory (a lock the OS releases when the
holder dies)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from hexagent_gym.experiments import evaluate
from hexagent_gym.experiments.cell_log import (
    CELLS_FILE,
    QUARANTINE_FILE,
    CellLog,
    OutputLocked,
    read_cells,
    scan_cells,
)
from tests.experiments.tiny_grid import tiny_experiment


@pytest.fixture
def finished(tmp_path):
    ev = evaluate(tiny_experiment(), tmp_path, progress=False, timing=False)
    return tmp_path, ev.records


def lines_of(path):
    return path.read_bytes().split(b"\n")


def test_corrupted_lines_are_quarantined_with_a_warning_and_rerun(finished):
    out, records = finished
    path = out / CELLS_FILE
    lines = lines_of(path)
    edited = json.loads(lines[0])
    edited["cell"]["episode"]["num_workflows"] = 999  # a hand edit: no longer its key's cell
    missing = json.loads(lines[1])
    del missing["metrics"]
    lines[0] = json.dumps(edited).encode()
    lines[1] = json.dumps(missing).encode()
    lines[2] = b"\xff\xfe not utf-8"
    path.write_bytes(b"\n".join(lines))
    _, bad = scan_cells(path)
    assert [(n, why.split(" ")[0]) for n, why in bad] == [(1, "its"), (2, "field"), (3, "not")]
    with pytest.warns(RuntimeWarning, match=r"3 line\(s\) are not valid cell records"):
        again = evaluate(tiny_experiment(), out, resume=True, progress=False, timing=False)
    assert again.computed == 3 and again.reused == len(records) - 3
    assert [r["metrics"] for r in again.records] == [r["metrics"] for r in records]
    quarantined = [json.loads(x) for x in (out / QUARANTINE_FILE).read_text().splitlines()]
    assert [q["line"] for q in quarantined] == [1, 2, 3]
    assert "edited by hand" in quarantined[0]["why"]
    assert len(read_cells(path)) == len(records)  # the file holds valid records only


def test_a_second_run_into_the_same_directory_is_refused(tmp_path):
    first = CellLog(tmp_path, [], resume=False)
    try:
        with pytest.raises(OutputLocked, match="being written by another run"):
            CellLog(tmp_path, [], resume=False)
    finally:
        first.close()
    CellLog(tmp_path, [], resume=True).close()  # released: the next run may write


def test_the_lock_dies_with_its_process(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from hexagent_gym.experiments.cell_log import CellLog\n"
         f"log = CellLog({str(tmp_path)!r}, [], resume=False)\n"
         "print('locked', flush=True)\n"
         "time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(OutputLocked, match=rf"pid {holder.pid}"):
            CellLog(tmp_path, [], resume=True)
        holder.kill()  # SIGKILL: no clean-up runs, the OS drops the lock
        holder.wait(timeout=30)
        for _ in range(50):
            try:
                CellLog(tmp_path, [], resume=True).close()
                break
            except OutputLocked:
                time.sleep(0.1)
        else:
            pytest.fail("the lock outlived its holder")
    finally:
        holder.kill()
