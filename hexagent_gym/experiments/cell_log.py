"""The run's append-only files: ``cells.jsonl`` (one record per finished cell, flushed as it
finishes, read back to resume) and ``failures.jsonl`` (one line per failed cell)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hexagent_gym.experiments.cells import RECORD_SCHEMA, CellFailure

CELLS_FILE = "cells.jsonl"
FAILURES_FILE = "failures.jsonl"


def read_cells(path: str | Path) -> dict[str, dict[str, Any]]:
    """Finished cell records of a ``cells.jsonl`` file, by cell key.

    A truncated last line (an interrupted write) is ignored; records of another schema version
    are skipped (their keys differ anyway).
    """
    path = Path(path)
    out: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return out
    with path.open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and rec.get("schema") == RECORD_SCHEMA and "key" in rec:
                out[rec["key"]] = rec
    return out


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
        path = out / CELLS_FILE
        self.finished: dict[str, dict[str, Any]] = {}
        if resume:
            wanted = set(keys)
            self.finished = {k: r for k, r in read_cells(path).items() if k in wanted}
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
