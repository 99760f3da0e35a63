"""How a run stops: pool workers die with their parent (even one killed by SIGKILL), and
SIGINT or SIGTERM keep every finished cell (those the workers already sent back included), stop
the workers, say how many cells are kept and exit 130 / 143; --resume then completes the run
exactly as an uninterrupted one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hexagent_gym.experiments import CELLS_FILE, CellLog, evaluate, read_cells
from hexagent_gym.experiments.interrupts import RunInterrupted, StopSignals
from tests.experiments.slow_policy import (
    EVALUATE,
    ROOT,
    SLEEP_ENV,
    TINY_FLAGS,
    alive,
    children,
    wait_until,
)
from tests.experiments.tiny_grid import tiny_experiment

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").is_file(),
                                reason="finds worker processes through /proc (Linux)")


def _default_stop_signals() -> None:
    """In the child: SIGINT and SIGTERM at their defaults, as in a user's terminal. A test run
    started in the background (``cmd &``) ignores SIGINT, the child would inherit that, and the
    runner rightly leaves an ignored signal alone."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class Cli:
    """scripts/evaluate.py (with the sleepy policy) in a subprocess whose output goes to files:
    a pipe would keep a reader waiting on any process that outlived the run."""

    def __init__(self, out, *flags, sleep=None, **popen):
        env = {k: v for k, v in os.environ.items() if k != SLEEP_ENV}
        if sleep is not None:
            env[SLEEP_ENV] = str(sleep)
        out = Path(out)
        self.logs = out.with_name(out.name + ".stdout"), out.with_name(out.name + ".stderr")
        with self.logs[0].open("w") as stdout, self.logs[1].open("w") as stderr:
            self.proc = subprocess.Popen([*EVALUATE, *TINY_FLAGS, "--out", str(out), *flags],
                                         cwd=ROOT, env=env, stdout=stdout, stderr=stderr,
                                         preexec_fn=_default_stop_signals, **popen)
        self.pid = self.proc.pid
        self.workers: list[int] = []

    def wait(self, timeout=120):
        """(exit status, stdout, stderr)."""
        code = self.proc.wait(timeout=timeout)
        return code, self.logs[0].read_text(), self.logs[1].read_text()

    def kill(self):
        """Kill the run and whichever of its workers outlived it (the test fails on those)."""
        self.proc.kill()
        self.proc.wait(timeout=30)
        for pid in self.workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_pool_workers_die_when_their_parent_is_killed(tmp_path):
    run = Cli(tmp_path / "out", "--policies", "sleepy", "--seeds", "0,1,2,3", "--workers", "2",
              sleep=60)
    try:
        run.workers = wait_until(lambda: len(children(run.pid)) == 2 and children(run.pid), 60)
        assert run.workers, f"no two workers appeared: {run.logs[1].read_text()[-2000:]}"
        run.proc.kill()  # SIGKILL: no clean-up of the parent runs
        run.proc.wait(timeout=30)
        gone = wait_until(lambda: not any(map(alive, run.workers)), 5)
        assert gone, f"workers {[p for p in run.workers if alive(p)]} outlived their parent"
        CellLog(tmp_path / "out", [], resume=True).close()  # nor does one keep the output locked
    finally:
        run.kill()


@pytest.mark.parametrize("use_prctl", [True, False], ids=["prctl-alone", "watchdog-alone"])
def test_die_with_parent_ends_an_orphan(use_prctl):
    code = ("import multiprocessing, os, time\n"
            "from hexagent_gym.experiments.worker_pool import die_with_parent\n"
            "def child(parent):\n"
            f"    how = die_with_parent(parent, use_prctl={use_prctl}, watchdog={not use_prctl})\n"
            "    os.write(1, f'how {how}\\n'.encode())  # one write: the processes share stdout\n"
            "    time.sleep(60)\n"
            "p = multiprocessing.get_context('fork').Process(target=child, args=(os.getpid(),))\n"
            "p.start()\n"
            "os.write(1, f'pid {p.pid}\\n'.encode())\n"
            "time.sleep(60)\n")
    middle = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    orphan = None
    try:
        said = dict(middle.stdout.readline().split() for _ in range(2))
        orphan = int(said["pid"])
        assert said["how"] == ("prctl" if use_prctl else "watchdog")
        assert alive(orphan)
        middle.kill()
        middle.wait(timeout=30)
        assert wait_until(lambda: not alive(orphan), 5), "the child outlived its parent"
    finally:
        middle.kill()
        if orphan is not None and alive(orphan):
            os.kill(orphan, signal.SIGKILL)  # (it holds the pipe communicate reads to its end)
        middle.communicate()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_keeps_the_finished_cells_and_resume_completes_the_run(tmp_path, signum):
    grid = ["--policies", "sleepy", "--seeds", "0,1,2,3,4,5", "--workers", "2"]
    out = tmp_path / "stopped"
    cells = out / CELLS_FILE
    # Ctrl-C at a terminal reaches the whole process group (workers too); SIGTERM the parent.
    run = Cli(out, *grid, sleep=0.7, start_new_session=True)
    try:
        assert wait_until(lambda: cells.is_file() and len(cells.read_text().splitlines()) >= 2,
                          60), run.logs[1].read_text()[-2000:]
        run.workers = children(run.pid)
        if signum == signal.SIGINT:
            os.killpg(run.pid, signum)
        else:
            os.kill(run.pid, signum)
        code, _, stderr = run.wait(timeout=60)
        assert code == 128 + signum, stderr[-3000:]
        assert wait_until(lambda: not any(map(alive, run.workers)), 5), "workers outlived it"
    finally:
        run.kill()
    assert "Traceback" not in stderr, stderr[-3000:]
    kept = len(read_cells(cells))
    assert 2 <= kept < 6 and len(cells.read_text().splitlines()) == kept
    line = f"interrupted by {signal.Signals(signum).name}: {kept} of 6 cells are kept in {cells}"
    assert [x for x in stderr.splitlines() if x.startswith("interrupted")] == [
        f"{line}; run the same command with --resume (resume=True) to run the other {6 - kept}"]
    code, r_out, r_err = Cli(out, *grid, "--resume").wait()
    assert code == 0, r_err[-3000:]
    assert f"{6 - kept} cells run, {kept} reused" in r_err
    code, w_out, w_err = Cli(tmp_path / "whole", *grid).wait()
    assert code == 0, w_err[-3000:]
    assert r_out == w_out  # the tables
    strip = {k: {f: v for f, v in r.items() if f != "timing"}
             for k, r in read_cells(cells).items()}
    assert strip == {k: {f: v for f, v in r.items() if f != "timing"}
                     for k, r in read_cells(tmp_path / "whole" / CELLS_FILE).items()}


@pytest.fixture
def default_sigterm():
    """SIGTERM at its default for the test (an earlier test's library, e.g. Ray, may have left a
    handler of its own, which the runner respects and would not replace), restored after."""
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def sigterm_self():
    """SIGTERM this process, but only with the runner's handler in place (never kill pytest)."""
    handler = signal.getsignal(signal.SIGTERM)
    assert isinstance(getattr(handler, "__self__", None), StopSignals), handler
    os.kill(os.getpid(), signal.SIGTERM)


def test_a_stop_writes_the_records_the_workers_already_sent(tmp_path, default_sigterm):
    """The parent is busy with the first record when SIGTERM comes; the records the workers
    send meanwhile are written too before the run stops."""
    exp = tiny_experiment(seeds=(0, 1, 2, 3))  # 8 cells, one factory: 4 chunks of 2

    def stop_and_dawdle(record):
        if stop_and_dawdle.sent:
            return
        stop_and_dawdle.sent = True
        sigterm_self()
        time.sleep(3)  # both workers finish their first chunk meanwhile

    stop_and_dawdle.sent = False
    before = set(children(os.getpid()))  # e.g. a Ray instance an earlier test left running
    with pytest.raises(RunInterrupted) as info:
        evaluate(exp, tmp_path, progress=False, timing=False, workers=2,
                 on_record=stop_and_dawdle)
    stopped = info.value
    assert (stopped.signum, stopped.kept, stopped.total) == (signal.SIGTERM, 4, 8)
    assert stopped.exit_status == 143 and stopped.path == tmp_path / CELLS_FILE
    assert len(read_cells(tmp_path / CELLS_FILE)) == 4
    assert set(children(os.getpid())) - before == set()  # every worker gone
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored
    resumed = evaluate(exp, tmp_path, resume=True, progress=False, timing=False, workers=2)
    assert (resumed.computed, resumed.reused) == (4, 4)
    assert resumed.records == evaluate(exp, None, progress=False, timing=False).records


def test_a_serial_run_stops_on_sigterm_after_writing_the_record(tmp_path, default_sigterm):
    exp = tiny_experiment()
    with pytest.raises(RunInterrupted) as info:
        evaluate(exp, tmp_path, progress=False, timing=False,
                 on_record=lambda record: sigterm_self())
    assert (info.value.signum, info.value.kept, info.value.total) == (signal.SIGTERM, 1, 4)
    assert len((tmp_path / CELLS_FILE).read_text().splitlines()) == 1
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
