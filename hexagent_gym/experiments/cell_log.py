"""The run's append-only files: ``cells.jsonl`` (one record per finished cell, flushed as it
finishes, read back to resume) and ``failures.jsonl`` (one line per failed cell)."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hexagent_gym.experiments.cells import RECORD_SCHEMA, CellFailure, params_key

CELLS_FILE = "cells.jsonl"
FAILURES_FILE = "failures.jsonl"


class OutputLocked(RuntimeError):
    """Another run is writing to the same output directory."""


QUARANTINE_FILE = "cells.quarantine.jsonl"


def record_problem(rec: Any) -> str | None:
    """Why a ``cells.jsonl`` line cannot be resumed from, or None for a valid record: the
    record schema, the fields a report reads and their types, and a key that is the hash of its
    own cell parameters (a record whose values were edited by hand is not reused silently)."""
    if not isinstance(rec, dict):
        return f"not a JSON object but {type(rec).__name__}"
    if rec.get("schema") != RECORD_SCHEMA:
        return f"record schema {rec.get('schema')!r}, this version reads {RECORD_SCHEMA}"
    for name, kind in (("key", str), ("cell", dict), ("metrics", dict), ("workflows", dict)):
        if not isinstance(rec.get(name), kind):
            return f"field '{name}' is missing or not a {kind.__name__}"
    for name, value in rec["metrics"].items():
        if not isinstance(value, int | float) or isinstance(value, bool) or value != value:
            return f"metric '{name}' is {value!r}, not a number"
    try:
        expected = params_key(rec["cell"])
    except (TypeError, ValueError) as exc:
        return f"its cell parameters do not serialise ({exc})"
    if expected != rec["key"]:
        return "its cell parameters do not hash to its key (edited by hand?)"
    return None


def read_cells(path: str | Path) -> dict[str, dict[str, Any]]:
    """The valid finished cell records of a ``cells.jsonl`` file, by cell key (the lines
    :func:`scan_cells` reports are left out)."""
    return scan_cells(path)[0]


def scan_cells(path: str | Path) -> tuple[dict[str, dict[str, Any]], list[tuple[int, str]]]:
    """Finished cell records of a ``cells.jsonl`` file by cell key, and the lines that are not
    valid records as ``(line number, why)``.

    A truncated last line (an interrupted write: no newline at its end) is ignored, not
    reported. Lines that are not UTF-8, not JSON or not a valid record (:func:`record_problem`)
    are reported; the caller decides what to do with them (:class:`CellLog` quarantines them).
    """
    path = Path(path)
    out: dict[str, dict[str, Any]] = {}
    bad: list[tuple[int, str]] = []
    if not path.is_file():
        return out, bad
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1]:  # torn last line
        lines[-1] = b""
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            bad.append((number, "not UTF-8"))
            continue
        except (json.JSONDecodeError, RecursionError):
            bad.append((number, "not JSON"))
            continue
        problem = record_problem(rec)
        if problem is not None:
            bad.append((number, problem))
        else:
            out[rec["key"]] = rec
    return out, bad


def drop_torn_line(path: Path) -> None:
    """Drop a truncated last line so appended records start on a line of their own."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


class CellLog:
    """``out_dir/cells.jsonl`` open for appending, and ``out_dir/failures.jsonl``.

    Opening starts ``cells.jsonl`` afresh, or with ``resume`` keeps it (minus a torn last
    line) and exposes its records of the wanted keys as :attr:`finished`. A stale
    ``failures.jsonl`` is removed either way: this run retries every cell that failed before.
    :attr:`path` is the ``cells.jsonl`` file.

    Args:
        out_dir: the output directory (created if missing).
        keys: the keys of the grid's cells; resumed records of other keys are left out of
            :attr:`finished` (they stay in the file).
        resume: keep the finished records instead of starting afresh.
        timing: False drops the ``timing`` block of the resumed records, as a fresh run
            without timings would not have it.
    """

    def __init__(self, out_dir: str | Path, keys: Iterable[str], *, resume: bool,
                 timing: bool = True) -> None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        path = self.path = out / CELLS_FILE
        self._lock = _lock(out)
        self.finished: dict[str, dict[str, Any]] = {}
        self.quarantined: list[tuple[int, str]] = []
        if resume:
            wanted = set(keys)
            records, self.quarantined = scan_cells(path)
            if self.quarantined:
                _quarantine(path, self.quarantined)
            self.finished = {k: r for k, r in records.items() if k in wanted}
            if not timing:
                self.finished = {k: {f: v for f, v in r.items() if f != "timing"}
                                 for k, r in self.finished.items()}
            drop_torn_line(path)
        else:
            path.write_text("", encoding="utf-8")
        self._sink = path.open("a", encoding="utf-8")
        self.failures_path = out / FAILURES_FILE
        self.failures_path.unlink(missing_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        """Append one finished record and flush it, so an interrupt keeps it."""
        self._sink.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._sink.flush()

    def write_failure(self, failure: CellFailure) -> None:
        """Append one failed cell (parameters, error, traceback) to ``failures.jsonl``."""
        with self.failures_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(failure.to_dict(), separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._sink.close()
        _HELD_LOCKS.discard(self._lock)
        self._lock.close()  # releases the lock


_HELD_LOCKS: set[Any] = set()  # this process's open lock files


def _drop_inherited_locks() -> None:
    """In a forked child (a pool worker): point the inherited lock descriptors at /dev/null.
    An flock belongs to the open file, which a fork shares, so a worker that outlived its
    parent would otherwise keep ``--out`` locked; the descriptor numbers stay valid (dup2, not
    close), so the child's copy of the file object closes harmlessly."""
    if not _HELD_LOCKS:
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for handle in _HELD_LOCKS:
            os.dup2(null, handle.fileno())
    finally:
        os.close(null)
    _HELD_LOCKS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_inherited_locks)


def _lock(out: Path) -> Any:
    """Hold an exclusive lock on ``out/.lock`` until the returned file is closed (or the process
    dies: the OS releases it, so a killed run leaves no stale lock).

    Raises:
        OutputLocked: another live run holds it.
    """
    handle = (out / ".lock").open("a+", encoding="utf-8")
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, as before
        return handle
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        raise OutputLocked(f"{out} is being written by another run (pid {holder}); wait for it, "
                           "or give this run another --out") from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    _HELD_LOCKS.add(handle)
    return handle


def _quarantine(path: Path, bad: list[tuple[int, str]]) -> None:
    """Move the invalid lines of ``path`` to :data:`QUARANTINE_FILE` beside it (appended, each
    with its line number and the reason) and warn; the valid lines stay, in order."""
    numbers = {n for n, _ in bad}
    lines = path.read_bytes().split(b"\n")
    keep = [raw for i, raw in enumerate(lines, start=1) if i not in numbers]
    target = path.with_name(QUARANTINE_FILE)
    with target.open("a", encoding="utf-8") as f:
        for n, why in bad:
            text = lines[n - 1].decode("utf-8", errors="replace")
            f.write(json.dumps({"line": n, "why": why, "text": text}) + "\n")
    path.write_bytes(b"\n".join(keep))
    reasons = "; ".join(f"line {n}: {why}" for n, why in bad[:3])
    more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
    warnings.warn(f"{path}: {len(bad)} line(s) are not valid cell records and were moved to "
                  f"{target} ({reasons}{more}); their cells run again", RuntimeWarning,
                  stacklevel=3)
