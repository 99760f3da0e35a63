"""The local process pool of ``evaluate(workers=N)`` (and of any run with a cell timeout).

A small pool of its own rather than ``concurrent.futures.ProcessPoolExecutor``, for what that
one cannot do: stream each cell's record back as the cell finishes (not a chunk at a time),
kill one stuck worker and go on with a fresh one, and tie the workers' lives to this process.

Contracts:

- :meth:`WorkerPool.outcomes` yields one record or :class:`CellFailure` per cell, in the order
  they finish, and stops the workers when it ends (exhausted, closed or raising).
- A worker runs its chunk (cells sharing a factory, :mod:`.chunks`) one cell at a time with its
  process's factory cache and sends each outcome as soon as it has it; records are the same as
  a serial run's.
- Workers never outlive the process that started them (:func:`die_with_parent`).
- Workers ignore SIGINT and SIGTERM: Ctrl-C at a terminal signals the whole process group, and
  the parent alone decides what a stop means (it drains the outcomes already sent, then kills
  the workers: :class:`~hexagent_gym.experiments.interrupts.StopSignals`).
- ``cell_timeout``: a cell running longer becomes a :class:`CellFailure` (:class:`CellTimeout`),
  its worker is killed (SIGKILL) and replaced, and the rest of its chunk runs on. Building the
  cell's episode factory (shared by its group, built by the first cell a worker runs) has its
  own budget of the same length, so a slow build does not eat the first cell's.
- A worker that dies (out of memory, a crash in C code) fails the cell it was running
  (:class:`WorkerDied`); the rest of its chunk runs on another worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any

from hexagent_gym.config import ConfigError
from hexagent_gym.experiments.cells import Cell, CellFailure, run_cells
from hexagent_gym.experiments.chunks import process_factories
from hexagent_gym.experiments.interrupts import STOP_SIGNALS, StopSignals

Outcome = dict[str, Any] | CellFailure
CELL_TIMEOUT_KEY = "cell_timeout_s"
"""The per-cell timeout's name as an experiment option (seconds; ``--cell-timeout`` on the command
line): :func:`check_cell_timeout`'s default ``where``, for the YAML loader to validate it with."""
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_POLL_S = 0.5
"""How often a worker's watchdog thread checks that its parent is alive."""
STOP_POLL_S = 0.2
"""How often the parent, waiting on its workers, checks for a stop request."""
JOIN_S = 5.0
"""How long closing waits for a worker to exit before killing it."""
_STARTED = "started"  # a worker's message: the cell's factory is ready, the episode starts


class CellTimeout(RuntimeError):
    """A cell ran longer than the run's cell timeout; its worker process was killed."""


class WorkerDied(RuntimeError):
    """The worker process running a cell died before sending the cell's outcome."""


def check_cell_timeout(value: Any, where: str = CELL_TIMEOUT_KEY) -> float | None:
    """``value`` as a timeout in seconds (None: no timeout).

    Raises:
        ConfigError: not a finite number > 0; the message names ``where``.
    """
    if value is None:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{where} must be a finite number of seconds > 0 (or unset for no "
                          f"timeout), got {value!r}")
    return float(value)


def _libc_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:  # resolved here, in the parent: a forked child should not need the dynamic loader
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()
_arm_forks = False  # set around the pool's own forks only; the child sees the copy


def _set_pdeathsig() -> bool:
    return _PRCTL is not None and _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0


def _after_fork_in_child() -> None:
    # the earliest point Python offers in a forked worker: armed here, the kernel kills even a
    # child that dies or hangs before its first line of our code
    if _arm_forks:
        _set_pdeathsig()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def die_with_parent(parent_pid: int, *, use_prctl: bool = True, watchdog: bool = True) -> str:
    """Make this process exit when ``parent_pid``, its parent, does; call it first in a child.

    On Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` has the kernel kill this process when its
    parent exits, whatever killed the parent (even SIGKILL, where no clean-up of the parent
    runs). Everywhere (as a fallback where there is no ``prctl``, and as a backstop where there
    is), a daemon thread checks every :data:`PARENT_POLL_S` seconds whether this process was
    re-parented, and exits with ``os._exit`` if so. Exits at once if the parent died before this
    call.

    Args:
        parent_pid: the pid of the parent (``os.getpid()`` in the parent, before the fork).
        use_prctl, watchdog: False turns that mechanism off (tests check each alone).

    Returns:
        ``"prctl"`` if the kernel will kill this process, else ``"watchdog"``.
    """
    how = "prctl" if use_prctl and _set_pdeathsig() else "watchdog"
    # checked after prctl: a parent that died before it took effect has re-parented us already
    if os.getppid() != parent_pid:
        os._exit(1)
    if watchdog or how == "watchdog":
        threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True,
                         name="die-with-parent").start()
    return how


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _worker_main(conn: Any, parent_pid: int, timing: bool, use_prctl: bool) -> None:
    """A worker: receive chunks (lists of cells) until None or EOF, send one outcome per cell."""
    die_with_parent(parent_pid, use_prctl=use_prctl)
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # blocked by the parent around the fork
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    factories = process_factories()
    while True:
        try:
            cells = conn.recv()
        except (EOFError, OSError):
            return
        if cells is None:
            return
        for cell in cells:
            try:
                factories.get(cell.factory_config)  # built (or reused) on its own clock
            except Exception as exc:
                conn.send(CellFailure.of(cell, exc))
                continue
            conn.send(_STARTED)
            conn.send(run_cells([cell], timing, factories=factories, catch=True)[0])


@contextlib.contextmanager
def _stop_signals_blocked() -> Iterator[None]:
    # A forked child starts with the parent's Python signal handlers until its first lines run;
    # blocking the stop signals across the fork keeps a Ctrl-C in that window from raising in
    # the child (the child unblocks them once it ignores them; the parent gets them after).
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _context() -> Any:
    # fork on Linux, as ProcessPoolExecutor did here: policies registered at run time reach the
    # workers, and the worker's parent is this process (die_with_parent checks that pid). Never
    # forkserver, whose children are the server's.
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    ctx = multiprocessing.get_context()
    return multiprocessing.get_context("spawn") if ctx.get_start_method() == "forkserver" else ctx


@dataclass
class _Worker:
    proc: Any
    conn: Any
    chunk: list[Cell] = field(default_factory=list)
    done: int = 0  # cells of `chunk` whose outcome arrived; the next one is running
    since: float = 0.0  # when the running step began (its factory build, or its episode)
    started: bool = False  # the running cell's factory is built and its episode runs

    @property
    def busy(self) -> bool:
        return self.done < len(self.chunk)


class WorkerPool:
    """Run chunks of cells on ``workers`` processes; see the module's contracts.

    Args:
        chunks: the units of work (lists of cells, best sharing a factory).
        workers: processes to run at most (never more than there are chunks).
        timing: see :func:`~hexagent_gym.experiments.cells.run_cell`.
        cell_timeout: seconds a cell may run (None: no limit); checked by
            :func:`check_cell_timeout`.
        stop: polled while waiting; when it has a request, the outcomes already sent are
            yielded and then :meth:`StopSignals.raise_` raises.
        use_prctl: False: workers rely on the watchdog thread alone (no ``prctl``).
    """

    def __init__(self, chunks: Sequence[Sequence[Cell]], workers: int, *, timing: bool = True,
                 cell_timeout: float | None = None, stop: StopSignals | None = None,
                 use_prctl: bool = True) -> None:
        self._pending: deque[list[Cell]] = deque(list(c) for c in chunks if c)
        self._size = max(1, workers)
        self._timing = timing
        self._timeout = check_cell_timeout(cell_timeout, "cell_timeout")
        self._stop = stop
        self._use_prctl = use_prctl
        self._ctx = _context()
        self._workers: list[_Worker] = []

    def outcomes(self) -> Iterator[Outcome]:
        """Each cell's record or failure as it finishes; the workers are stopped at the end."""
        try:
            while self._pending or any(w.busy for w in self._workers):
                if self._stop is not None and self._stop.requested:
                    for w in list(self._workers):
                        yield from self._read(w)
                    self._stop.raise_()
                self._dispatch()
                ready = set(wait(self._waitables(), timeout=self._wait_s()))
                for w in list(self._workers):
                    if w.conn in ready or w.proc.sentinel in ready:
                        yield from self._read(w)
                        if not w.proc.is_alive() or w.conn.closed:
                            w.proc.join(1.0)  # its pipe closes a moment before it exits
                            yield from self._lost(w, WorkerDied(
                                f"the worker process running this cell died "
                                f"({_exit_text(w.proc)})"))
                yield from self._expire()
        finally:
            self.close()

    def close(self) -> None:
        """Stop every worker: idle ones are asked to exit, busy ones killed; any that has not
        exited after :data:`JOIN_S` seconds is killed. Idempotent."""
        workers, self._workers = self._workers, []
        for w in workers:
            if w.busy or not _ask_to_exit(w.conn):
                w.proc.kill()
        deadline = time.monotonic() + JOIN_S
        for w in workers:
            w.proc.join(max(0.0, deadline - time.monotonic()))
            if w.proc.exitcode is None:
                w.proc.kill()
                w.proc.join(JOIN_S)
            w.conn.close()

    def _dispatch(self) -> None:
        # (a worker whose pipe closed is dying: its sentinel drops it on the next wait)
        idle = [w for w in self._workers if not w.busy and not w.conn.closed]
        while self._pending and (idle or len(self._workers) < self._size):
            w = idle.pop() if idle else self._start()
            w.chunk, w.done, w.started = self._pending.popleft(), 0, False
            w.since = time.monotonic()
            # a worker that died unseen fails the send; its sentinel reports it on the next
            # wait and its first cell fails, so a worker that cannot start still lets the grid end
            with contextlib.suppress(OSError):
                w.conn.send(w.chunk)

    def _start(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker_main, daemon=True, name="hexagent-cell-worker",
                                 args=(child, os.getpid(), self._timing, self._use_prctl))
        global _arm_forks
        _arm_forks = self._use_prctl
        try:
            with _stop_signals_blocked():
                proc.start()
        finally:
            _arm_forks = False
        child.close()
        w = _Worker(proc, parent)
        self._workers.append(w)
        return w

    def _waitables(self) -> list[Any]:
        return [x for w in self._workers
                for x in ((w.proc.sentinel,) if w.conn.closed else (w.conn, w.proc.sentinel))]

    def _wait_s(self) -> float | None:
        waits = [] if self._stop is None else [STOP_POLL_S]
        if self._timeout is not None:
            now = time.monotonic()
            waits += [max(0.0, w.since + self._timeout - now) for w in self._workers if w.busy]
        return min(waits, default=None)

    def _read(self, w: _Worker) -> Iterator[Outcome]:
        """The outcomes ``w`` has sent, without blocking; closes its pipe at EOF."""
        while not w.conn.closed:
            try:
                if not w.conn.poll():
                    return
                outcome = w.conn.recv()
            except (EOFError, OSError):
                w.conn.close()
                return
            w.since = time.monotonic()
            if isinstance(outcome, str):  # _STARTED
                w.started = True
                continue
            w.done += 1
            w.started = False
            yield outcome

    def _expire(self) -> Iterator[Outcome]:
        if self._timeout is None:
            return
        for w in list(self._workers):
            if w.busy and time.monotonic() - w.since > self._timeout:
                yield from self._read(w)  # it may have finished just now
                if w.busy and time.monotonic() - w.since > self._timeout:
                    w.proc.kill()
                    what = ("the cell ran" if w.started else
                            "building the cell's episode factory took")
                    yield from self._lost(w, CellTimeout(
                        f"{what} longer than the cell timeout of {self._timeout:g} s "
                        f"({CELL_TIMEOUT_KEY}, --cell-timeout); its worker process was killed"))

    def _lost(self, w: _Worker, exc: Exception) -> Iterator[Outcome]:
        """Drop worker ``w``: fail its running cell with ``exc``, queue the rest of its chunk."""
        self._workers.remove(w)
        if w.proc.is_alive():  # a pipe that broke under a live worker: it cannot go on
            w.proc.kill()
        w.proc.join(JOIN_S)
        w.conn.close()
        if not w.busy:
            return
        cell, rest = w.chunk[w.done], w.chunk[w.done + 1:]
        if rest:
            self._pending.appendleft(rest)
        yield CellFailure.of(cell, exc, tb="")


def _ask_to_exit(conn: Any) -> bool:
    """Send an idle worker the None that ends its loop; False if its pipe is gone."""
    if conn.closed:
        return False
    try:
        conn.send(None)
    except OSError:
        return False
    return True


def _exit_text(proc: Any) -> str:
    code = proc.exitcode
    if code is None:
        return "its pipe broke while it still ran"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"
