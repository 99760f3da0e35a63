"""Traces parsed on demand: an episode reads only the workflows it samples.

:func:`~hexagent_gym.workload.workload.open_trace` returns a ``Trace`` whose ``workflows`` is a
:class:`LazyWorkflows`: a read-only sequence over a file's
:class:`~hexagent_gym.workload.trace_lines. LineIndex` that parses a workflow the first time it is
asked for and keeps it (so the same object comes back, as from a tuple). What each use of it reads:

- ``len()``: every line's offset (the whole file is read once, nothing parsed);
- ``w[i]`` / ``take(indices)``: those lines only, each parsed once;
- iteration: the whole file in order, each line parsed once (what ``load=`` needs: the offered
  load averages over every workflow);
- :meth:`LazyWorkflows.where_id` (the train/eval split) and :meth:`LazyWorkflows.replay_order` of
  our schema: one pass that decodes every line but keeps only its id and ``arrival_s``;
  a Mooncake replay of the first ``n`` rows reads those ``n`` rows only (the format keeps rows
  sorted by time, so file order is arrival order).

Validation is that of :func:`~hexagent_gym.workload.workload.load_trace`, applied to the lines that
are
read: a bad line that an episode never reads is not reported, and file-wide checks (duplicate
workflow ids, one block size, sorted Mooncake timestamps) cover the workflows parsed so far
(``load_trace`` checks the whole file). Block ids come from one allocator per file, so ids are
consistent whatever order workflows are parsed in (their values never reach a result).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from hexagent_gym.workload.prompts import BlockIds
from hexagent_gym.workload.specs import MAX_SECONDS, TraceLimits, WorkflowSpec, _fail, decode_line
from hexagent_gym.workload.trace_formats import check_row, mooncake_workflow
from hexagent_gym.workload.trace_lines import LineIndex
from hexagent_gym.workload.workflow_parser import _as_id, parse_workflow_object


class NoArrivalTimes(Exception):
    """Replay asked of a trace whose workflow ``workflow`` has no ``arrival_s``."""

    def __init__(self, workflow: WorkflowSpec) -> None:
        super().__init__(workflow.workflow_id)
        self.workflow = workflow


class TooFewWorkflows(Exception):
    """Replay asked for more workflows than the trace's ``size``."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class WorkflowStore:
    """Parsed-on-demand workflows of one file in our schema (one workflow per line)."""

    sorted_by_arrival = False
    """Whether the format guarantees file order is arrival order (then replay reads a prefix)."""
    limit_field = "calls[{i}].input_tokens + output_tokens"

    def __init__(self, index: LineIndex, name: str, block_tokens: int | None) -> None:
        self.index = index
        self.source = index.source
        self.name = name
        self.block_tokens = block_tokens
        self.ids = BlockIds()
        self.parsed: dict[int, WorkflowSpec] = {}
        # (workflow id(), context bound, KV bound) already checked: an env resets every episode
        # and samples the same workflows again, and the check is per call
        self._passed: set[tuple[int, int | None, int | None]] = set()
        self._first_line: dict[str, int] = {}  # workflow id -> line, of the parsed workflows
        self._first: WorkflowSpec | None = None  # the first parsed (block-size check)
        self._columns: tuple[list[str], array] | None = None

    def size(self) -> int:
        return len(self.index)

    # ---- parsing -------------------------------------------------------------------------------

    def _parse(self, pos: int, lineno: int, raw: bytes,
               limits: TraceLimits | None) -> WorkflowSpec:
        del pos  # a workflow of our schema names itself
        wf = parse_workflow_object(decode_line(raw, self.source, lineno), self.source, lineno,
                                   default_source=self.name, ids=self.ids,
                                   block_tokens=self.block_tokens, limits=limits)
        first = self._first
        if first is not None and wf.block_tokens != first.block_tokens:
            _fail(self.source, lineno, "hash_block_tokens", f"{wf.block_tokens} differs from "
                  f"{first.block_tokens} on line {first.line}",
                  "every workflow of one trace must use the same block size")
        earlier = self._first_line.get(wf.workflow_id)
        if earlier is not None:
            a, b = sorted((earlier, lineno))
            _fail(self.source, lineno, "workflow_id", f"duplicate workflow id "
                  f"'{wf.workflow_id}' (lines {a} and {b})",
                  "workflow ids must be unique within a file")
        self._first_line[wf.workflow_id] = lineno
        if first is None:
            self._first = wf
        return wf

    def _checked(self, wf: WorkflowSpec, limits: TraceLimits | None) -> WorkflowSpec:
        """A cached workflow, checked against ``limits`` (it may have been parsed under
        others: the check is O(calls) and allocates nothing)."""
        if limits is not None:
            key = (id(wf), limits.max_context_tokens, limits.max_kv_tokens)
            if key in self._passed:  # the parsed workflows live as long as the store
                return wf
            for i, c in enumerate(wf.calls):
                who = f"call '{c.id}' " if len(wf.calls) > 1 or c.id != "0" else ""
                limits.check(self.source, wf.line, self.limit_field.format(i=i), who,
                             c.input_tokens, c.output_tokens)
            self._passed.add(key)
        return wf

    def get_many(self, positions: Sequence[int],
                 limits: TraceLimits | None) -> list[WorkflowSpec]:
        """The workflows of the given line positions, in that order (parsed once each, the
        new ones in file order so the file is read forwards)."""
        parsed = self.parsed
        todo = sorted({p for p in positions if p not in parsed})
        for pos, lineno, raw in self.index.lines(todo):
            parsed[pos] = self._parse(pos, lineno, raw, limits)
        return [self._checked(parsed[p], limits) for p in positions]

    def iterate(self, limits: TraceLimits | None) -> Iterator[WorkflowSpec]:
        """Every workflow in file order; the whole file is validated in order."""
        parsed = self.parsed
        prev: WorkflowSpec | None = None
        for pos, lineno, raw in self.index.all_lines():
            wf = parsed.get(pos)
            if wf is None:
                wf = parsed[pos] = self._parse(pos, lineno, raw, limits)
            else:
                wf = self._checked(wf, limits)
            if self.sorted_by_arrival:
                _check_order(prev, wf, self.source)
                prev = wf
            yield wf

    # ---- columns: ids and arrival times without building workflows -----------------------------

    def columns(self) -> tuple[list[str], array]:
        """Every line's workflow id and ``arrival_s`` (NaN: null), from one decoding pass; a line
        whose id or time is invalid is parsed in full, which reports it."""
        if self._columns is None:
            ids: list[str] = []
            times = array("d")
            for pos, lineno, raw in self.index.all_lines():
                obj = decode_line(raw, self.source, lineno)
                wid = _as_id(obj.get("workflow_id")) if isinstance(obj, dict) else None
                t = obj.get("arrival_s") if isinstance(obj, dict) else None
                valid_t = t is None or (type(t) in (int, float) and math.isfinite(t)
                                        and 0 <= t <= MAX_SECONDS)
                if wid is None or not valid_t:
                    self.get_many([pos], None)  # raises the parser's own message
                ids.append(wid)
                times.append(math.nan if t is None else float(t))
            self._columns = ids, times
        return self._columns


class MooncakeStore(WorkflowStore):
    """Mooncake rows: row ``i`` is the one-call workflow ``<name>/<i>``, arriving at its
    timestamp; rows are sorted by time (checked over the rows read in order)."""

    sorted_by_arrival = True
    limit_field = "input_length + output_length"

    def _parse(self, pos: int, lineno: int, raw: bytes,
               limits: TraceLimits | None) -> WorkflowSpec:
        row = check_row("mooncake", decode_line(raw, self.source, lineno), self.source, lineno)
        return mooncake_workflow(row, lineno, pos, self.ids, self.source, self.name, limits)

    def columns(self) -> tuple[list[str], array]:
        if self._columns is None:
            n = self.size()
            self._columns = [f"{self.name}/{i}" for i in range(n)], array("d")
        return self._columns


def _check_order(prev: WorkflowSpec | None, wf: WorkflowSpec, source: str) -> None:
    """A row of a time-sorted format must not arrive before the row read before it. Compared
    in seconds (``timestamp / 1000`` is monotonic), which the parsed workflows keep."""
    if prev is not None and wf.arrival_s < prev.arrival_s:
        _fail(source, wf.line, "timestamp", f"{round(wf.arrival_s * 1000.0, 6)!r} is earlier "
              f"than the timestamp {round(prev.arrival_s * 1000.0, 6)!r} on line {prev.line}",
              "rows must be sorted by timestamp (non-decreasing in file order)")


class LazyWorkflows(Sequence):
    """A read-only sequence of a trace's workflows (or of a subset of its lines), parsed on
    first access (module docstring). Compares equal to any sequence of equal workflows."""

    __slots__ = ("_store", "_positions", "_limits")

    def __init__(self, store: WorkflowStore, positions: Sequence[int] | None,
                 limits: TraceLimits | None) -> None:
        self._store = store
        self._positions = positions  # None: every line of the file
        self._limits = limits

    def __len__(self) -> int:
        return len(self._positions) if self._positions is not None else self._store.size()

    def _pos(self, indices: Iterable[int]) -> list[int]:
        indices = list(indices)
        if self._positions is None and all(i >= 0 for i in indices):
            # count only as far as the largest index: the rest of the file is not read
            n = self._store.index.ensure(max(indices, default=-1) + 1)
        else:
            n = len(self)
        out = []
        for i in indices:
            j = i + n if i < 0 else i
            if not 0 <= j < n:
                raise IndexError(f"workflow index {i} out of range for {len(self)} workflows")
            out.append(self._positions[j] if self._positions is not None else j)
        return out

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return tuple(self.take(range(len(self))[i]))
        return self.take([int(i)])[0]

    def take(self, indices: Iterable[int]) -> list[WorkflowSpec]:
        """The workflows at ``indices`` (in that order), reading only their lines."""
        return self._store.get_many(self._pos(indices), self._limits)

    def __iter__(self) -> Iterator[WorkflowSpec]:
        if self._positions is None:
            yield from self._store.iterate(self._limits)
            return
        chunk = 4096  # one open of the file per chunk of lines
        for start in range(0, len(self._positions), chunk):
            yield from self.take(range(start, min(start + chunk, len(self._positions))))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LazyWorkflows({self._store.source!r}, {len(self)} workflows)"

    def where_id(self, keep: Callable[[str], bool]) -> LazyWorkflows:
        """The workflows whose id ``keep`` accepts, in order (one pass over ids, no parsing)."""
        ids, _ = self._store.columns()
        every = range(len(ids)) if self._positions is None else self._positions
        return LazyWorkflows(self._store, array("q", (p for p in every if keep(ids[p]))),
                             self._limits)

    def replay_order(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(indices into this sequence, arrival times) of the first ``n`` workflows in order of
        ``arrival_s`` (stable: ties keep file order), as ``arrivals.sample_episode`` replays.

        Raises:
            NoArrivalTimes: a workflow has ``arrival_s = null`` (the first in file order).
            TooFewWorkflows: fewer than ``n`` workflows.
        """
        store = self._store
        if store.sorted_by_arrival:
            if self._positions is None and store.index.ensure(n) < n or \
                    self._positions is not None and len(self._positions) < n:
                raise TooFewWorkflows(len(self))
            positions = self._pos(range(n))
            workflows = store.get_many(positions, self._limits)
            # time order, over the rows replayed
            for prev, wf in zip([None, *workflows[:-1]], workflows, strict=True):
                _check_order(prev, wf, store.source)
            times = np.array([w.arrival_s for w in workflows], dtype=np.float64)
            return np.arange(n, dtype=np.int64), times
        _, column = store.columns()
        every = np.frombuffer(column, dtype=np.float64) if len(column) else np.zeros(0)
        times = every if self._positions is None else every[np.asarray(self._positions,
                                                                        dtype=np.int64)]
        missing = np.flatnonzero(np.isnan(times))
        if len(missing):
            raise NoArrivalTimes(self.take([int(missing[0])])[0])
        if n > len(times):
            raise TooFewWorkflows(len(times))
        indices = np.argsort(times, kind="stable")[:n]
        return indices, times[indices]
