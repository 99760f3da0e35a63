"""Stopping a run on SIGINT (Ctrl-C) or SIGTERM without losing a finished cell.

:class:`StopSignals` turns both signals into a :class:`RunInterrupted` raised where nothing is
lost: never in the middle of writing a record, and, with the process pool, only after every
record the workers already sent back has been written. ``evaluate`` re-raises it with the
number of cells kept; the command line prints that in one line and exits with 128 + the
signal's number (130 for SIGINT, 143 for SIGTERM), as a shell reports a process the signal
killed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(KeyboardInterrupt):  # noqa: N818 (a KeyboardInterrupt, named like one)
    """A run stopped by SIGINT or SIGTERM after writing every cell that had finished.

    A :class:`KeyboardInterrupt`, so code that stops on Ctrl-C stops on it too, and
    ``except Exception`` (a cell's own error handling) does not swallow it.

    Attributes:
        signum: the signal (``signal.SIGINT`` also for a plain ``KeyboardInterrupt``).
        kept: the grid's cells whose records are kept (in ``path``, resumed ones included).
        total: the grid's cells.
        path: the ``cells.jsonl`` holding them (None: an in-memory run).
    """

    def __init__(self, signum: int, kept: int = 0, total: int = 0,
                 path: Path | None = None) -> None:
        self.signum = int(signum)
        self.kept = kept
        self.total = total
        self.path = path
        super().__init__(self.message())

    @property
    def exit_status(self) -> int:
        """128 + the signal's number: what a shell reports for a process the signal killed."""
        return 128 + self.signum

    @property
    def signal_name(self) -> str:
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"

    def message(self) -> str:
        """One line: which signal, how many cells are kept where, and how to continue."""
        if self.path is None:
            return (f"interrupted by {self.signal_name}: {self.kept} of {self.total} cells "
                    f"finished (not saved: no output directory)")
        return (f"interrupted by {self.signal_name}: {self.kept} of {self.total} cells are "
                f"kept in {self.path}; run the same command with --resume (resume=True) to run "
                f"the other {self.total - self.kept}")


class StopSignals:
    """While entered, SIGINT and SIGTERM request a stop instead of killing the run abruptly.

    Args:
        immediate: True when cells run in this process (serial, Ray driver): the handler raises
            :class:`RunInterrupted` at once (an exception is the only way to stop a running
            cell), except inside :meth:`held`, where the raise waits for the block's end so a
            record is written whole. False when cells run in worker processes: the handler
            only records the request (:attr:`requested`) and the pool, polling it, calls
            :meth:`raise_` once the records already sent back are written.

    Handlers are installed only in the main thread (Python delivers signals there alone) and
    only over the defaults (SIGINT's ``default_int_handler``, SIGTERM's ``SIG_DFL``): a
    caller's own handler, or ``SIG_IGN`` (``nohup``, a background job), is left alone. The
    previous handlers are restored on exit. A second signal while a stop is under way is only
    recorded, so the clean-up it is waiting for is not cut short.
    """

    def __init__(self, *, immediate: bool) -> None:
        self.immediate = immediate
        self.signum: int | None = None
        self._held = 0
        self._raised = False
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """A stop signal arrived."""
        return self.signum is not None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
        for signum in STOP_SIGNALS:
            current = signal.getsignal(signum)
            if current is defaults[signum]:
                self._previous[signum] = current
                signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            return  # a stop is under way: let it finish
        self.signum = signum
        if self.immediate and not self._held:
            self.raise_()

    def raise_(self) -> None:
        """Raise :class:`RunInterrupted` for the signal that arrived (once)."""
        self._raised = True
        raise RunInterrupted(self.signum or signal.SIGINT)

    def check(self) -> None:
        """Raise :class:`RunInterrupted` if a stop was requested and not raised yet."""
        if self.requested and not self._raised:
            self.raise_()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """A block a signal does not interrupt: a stop requested inside it is raised at its
        end (immediate mode; without it the request waits for :meth:`check` anyway)."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
        if self.immediate and not self._held:
            self.check()
