"""Public request-trace formats read by path: Mooncake/Kimi (FAST'25) and Qwen-Bailian.

:func:`detect_format` looks at the first non-blank row's keys; our own schema (rows with
``workflow_id`` and ``calls``) is not handled here. :func:`parse_public` turns a whole file of
one public format into workflows (see ``docs/trace_formats.md``):

- **Mooncake** rows ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}`` (512-token
  blocks): every row is a one-call workflow arriving at ``timestamp / 1000`` seconds.
- **Qwen-Bailian** rows ``{"chat_id", "parent_chat_id", "timestamp": s, "input_length",
  "output_length", "type", "turn", "hash_ids"}`` (16-token blocks): rows linked by
  ``parent_chat_id`` form one workflow per root (``parent_chat_id = -1``); a child waits
  ``child.timestamp - parent.timestamp`` seconds after its parent finishes.

Hash ids are remapped into the process's block-id space (one ``BlockIds`` per file), so equal hash
ids within a file are equal blocks and ids of different files never collide; a call given fewer
than ``ceil(input_length / block)`` hash ids gets fresh ids for the rest of its prompt.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from typing import Any

from hexagent_gym.workload.prompts import BlockIds, num_blocks, own_hit_tokens
from hexagent_gym.workload.specs import (
    MAX_SECONDS,
    MAX_TOKENS,
    CallSpec,
    TraceError,
    TraceLimits,
    WorkflowSpec,
    _fail,
    json_lines,
)

MOONCAKE_KEYS = frozenset({"timestamp", "input_length", "output_length", "hash_ids"})
BAILIAN_KEYS = frozenset({"chat_id", "parent_chat_id", "timestamp", "input_length",
                          "output_length", "hash_ids"})

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per hash id in Mooncake/Kimi traces."""
BAILIAN_BLOCK_TOKENS = 16
"""Tokens per hash id in Qwen-Bailian usage traces."""

FORMATS = ("mooncake", "bailian")
"""Names :func:`detect_format` returns (and ``WorkflowSpec.source`` of the parsed workflows)."""

_LABEL = {"mooncake": "Mooncake", "bailian": "Qwen-Bailian"}
_REQUIRED = {
    # in the order the error messages list them
    "mooncake": ("timestamp", "input_length", "output_length", "hash_ids"),
    "bailian": ("chat_id", "parent_chat_id", "timestamp", "input_length", "output_length",
                "hash_ids"),
}
# Keys that mark a row of another format: a file mixing formats is refused rather than read with
# part of its structure ignored.
_FOREIGN = {
    "mooncake": ("chat_id", "parent_chat_id", "workflow_id", "calls"),
    "bailian": ("workflow_id", "calls"),
}


def detect_format(text: str, source: str) -> str | None:
    """``"mooncake"``, ``"bailian"`` or None (our own schema) from the first row's keys."""
    for raw in text.split("\n"):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, RecursionError):
            return None  # the schema parser reports it with its line number
        return format_of_row(obj)
    return None


def format_of_row(obj: Any) -> str | None:
    """``"mooncake"``, ``"bailian"`` or None (our own schema) from one decoded row's keys."""
    if not isinstance(obj, dict) or "workflow_id" in obj or "calls" in obj:
        return None
    keys = set(obj)
    if keys >= BAILIAN_KEYS:
        return "bailian"
    if keys >= MOONCAKE_KEYS:
        return "mooncake"
    return None


def parse_public(fmt: str, text: str, source: str, name: str) -> tuple[WorkflowSpec, ...]:
    """Parse a whole file of a public format into workflows (see the module docstring).

    Args:
        fmt: ``"mooncake"`` or ``"bailian"`` (from :func:`detect_format`).
        text: the file's text.
        source: the file's path, used in error messages.
        name: the trace name; workflow ids are ``"<name>/<row index>"`` (Mooncake) or
            ``"<name>/<root chat_id>"`` (Qwen-Bailian).

    Returns:
        The workflows in file order (Qwen-Bailian: in the order of their root rows).

    Raises:
        TraceError: any invalid row; the message names the file, the 1-based line and the field.
    """
    return parse_public_rows(fmt, json_lines(text, source), source, name)


def parse_public_rows(fmt: str, rows: Iterable[tuple[int, Any]], source: str, name: str,
                      limits: TraceLimits | None = None) -> tuple[WorkflowSpec, ...]:
    """:func:`parse_public` from decoded ``(line, row)`` pairs (a streamed file); ``limits``
    are checked on every row before its block ids are built."""
    if fmt == "mooncake":
        ids, clock = BlockIds(), _Clock(source)
        workflows = tuple(mooncake_workflow(row, line, index, ids, source, name, limits, clock)
                          for index, (line, row) in enumerate(_rows(rows, source, fmt)))
    elif fmt == "bailian":
        workflows = _parse_bailian(rows, source, name, limits)
    else:
        raise TraceError(f"{source}: unknown public trace format {fmt!r}; expected one of "
                         f"{', '.join(FORMATS)}")
    if not workflows:
        raise TraceError(f"{source}: the trace file is empty (no rows); expected one JSON "
                         f"object per line")
    return workflows


def ideal_prefix_hit_rate(workflows: Iterable[WorkflowSpec]) -> float:
    """Token-weighted prefix hit rate of every call under an unbounded prefix cache.

    Calls are taken workflow by workflow in order of ``arrival_s`` (a stable sort, so ties keep
    the given order; if any workflow has no ``arrival_s`` the given order is used throughout),
    and within a workflow in call order. A call hits its leading blocks already seen (stopping
    at the first unseen one): ``hit = min(count * block_tokens, input_tokens)``; then all its
    blocks become seen. Returns ``sum(hit) / sum(input_tokens)`` (0.0 with no calls).

    Args:
        workflows: the workflows (e.g. ``trace.workflows``).
    """
    wfs = list(workflows)
    if all(w.arrival_s is not None for w in wfs):
        wfs.sort(key=lambda w: w.arrival_s)  # list.sort is stable
    seen: set[int] = set()
    hit = total = 0
    for wf in wfs:
        block = wf.block_tokens
        for call in wf.calls:
            k = 0
            for b in call.blocks:
                if b not in seen:
                    break
                k += 1
            hit += min(k * block, call.input_tokens)
            total += call.input_tokens
            seen.update(call.blocks)
    return hit / total if total else 0.0


# ---- shared row checks ---------------------------------------------------------------------------

def _rows(rows: Iterable[tuple[int, Any]], source: str,
          fmt: str) -> Iterator[tuple[int, dict]]:
    """Yield ``(line, row)`` for every decoded row, checking object type and keys."""
    for lineno, row in rows:
        yield lineno, check_row(fmt, row, source, lineno)


def check_row(fmt: str, row: Any, source: str, lineno: int) -> dict:
    """``row`` itself once it is an object with every key of ``fmt`` and no foreign key."""
    label = _LABEL[fmt]
    required = _REQUIRED[fmt]
    if not isinstance(row, dict):
        raise TraceError(f"{source}:{lineno}: expected a JSON object (a {label} row with "
                         f"{', '.join(required)}), got {type(row).__name__}")
    for key in required:
        if key not in row:
            _fail(source, lineno, key, "missing", f"every row of a {label} trace (format "
                  f"detected from the first row's keys) needs {', '.join(required)}")
    for key in _FOREIGN[fmt]:
        if key in row:
            _fail(source, lineno, key, f"unexpected in a {label} trace (format detected "
                  "from the first row's keys)", "one file holds rows of one format only")
    return row


def _tokens(row: dict, key: str, source: str, line: int) -> int:
    value = row[key]
    # exact type: rejects bools and floats such as 3.0
    if type(value) is not int or not 1 <= value <= MAX_TOKENS:
        _fail(source, line, key, f"got {value!r}", f"expected an integer in [1, {MAX_TOKENS:,}] "
              "(a token count; floats such as 3.0 are not accepted)")
    return value


def _timestamp(row: dict, source: str, line: int, unit: str) -> float:
    value = row["timestamp"]
    top = MAX_SECONDS * (1000.0 if unit == "milliseconds" else 1.0)
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value)):
        _fail(source, line, "timestamp", f"got {value!r}",
              f"expected a finite number of {unit} >= 0")
    if value < 0:
        _fail(source, line, "timestamp", f"negative time {value!r}",
              f"expected a number of {unit} >= 0 since the start of the trace")
    if value > top:
        _fail(source, line, "timestamp", f"got {value!r}", f"expected a number of {unit} in "
              f"[0, {top:.0e}] (finer than a microsecond in float64)")
    return float(value)


class _Clock:
    """Checks that timestamps never decrease in file order."""

    __slots__ = ("last", "last_raw", "line", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.last = -math.inf
        self.last_raw: Any = None
        self.line = 0

    def tick(self, value: float, raw: Any, line: int) -> None:
        if value < self.last:
            _fail(self.source, line, "timestamp", f"{raw!r} is earlier than the timestamp "
                  f"{self.last_raw!r} on line {self.line}", "rows must be sorted by timestamp "
                  "(non-decreasing in file order)")
        self.last, self.last_raw, self.line = value, raw, line


def _blocks(row: dict, n_in: int, block: int, ids: BlockIds, source: str,
            line: int) -> tuple[int, ...]:
    """The call's prompt block ids: its hash ids remapped, padded with fresh ids."""
    value = row["hash_ids"]
    if not isinstance(value, list) or any(type(v) is not int for v in value):
        _fail(source, line, "hash_ids", f"got {repr(value)[:60]}",
              "expected a list of integer hash ids (one per block of "
              f"{block} prompt tokens)")
    limit = num_blocks(n_in, block)
    if len(value) > limit:
        _fail(source, line, "hash_ids", f"{len(value)} ids but input_length = {n_in} fills "
              f"only {limit} blocks of {block} tokens",
              f"give at most ceil(input_length / {block}) = {limit} ids")
    external = ids.external
    blocks = [external(v) for v in value]
    blocks.extend(BlockIds.fresh() for _ in range(limit - len(value)))
    return tuple(blocks)


# ---- Mooncake ------------------------------------------------------------------------------------

def mooncake_workflow(row: dict, line: int, index: int, ids: BlockIds, source: str, name: str,
                      limits: TraceLimits | None = None,
                      clock: _Clock | None = None) -> WorkflowSpec:
    """The one-call workflow of a checked Mooncake row (``index``: its row index from 0).

    ``clock`` checks that timestamps never decrease over the rows it has seen (None: the row is
    read on its own, out of file order, so the order is not checked).
    """
    block = MOONCAKE_BLOCK_TOKENS
    ts = _timestamp(row, source, line, "milliseconds")
    if clock is not None:
        clock.tick(ts, row["timestamp"], line)
    n_in = _tokens(row, "input_length", source, line)
    n_out = _tokens(row, "output_length", source, line)
    if limits is not None:
        limits.check(source, line, "input_length + output_length", "", n_in, n_out)
    blocks = _blocks(row, n_in, block, ids, source, line)
    call = CallSpec(id="0", parents=(), children=(), input_tokens=n_in, output_tokens=n_out,
                    tool_latency_s=0.0, kind="request", blocks=blocks, own_hit=0)
    return WorkflowSpec(workflow_id=f"{name}/{index}", source="mooncake", calls=(call,),
                        arrival_s=ts / 1000.0, line=line, block_tokens=block, app_id="mooncake")


# ---- Qwen-Bailian --------------------------------------------------------------------------------

def _chat_id(row: dict, key: str, source: str, line: int, valid: str) -> int:
    value = row[key]
    if type(value) is not int:
        _fail(source, line, key, f"got {value!r}", valid)
    return value


def _parse_bailian(rows: Iterable[tuple[int, Any]], source: str, name: str,
                   limits: TraceLimits | None) -> tuple[WorkflowSpec, ...]:
    block = BAILIAN_BLOCK_TOKENS
    ids = BlockIds()
    clock = _Clock(source)
    # per workflow: its root line, root chat id, arrival and the rows of its calls as
    # (chat_id, parent index, input, output, tool latency, kind, blocks, timestamp)
    groups: list[tuple[int, int, float, list[tuple]]] = []
    where: dict[int, tuple[int, int, int]] = {}  # chat_id -> (workflow, call index, line)
    for line, row in _rows(rows, source, "bailian"):
        cid = _chat_id(row, "chat_id", source, line, "expected an integer chat id")
        parent = _chat_id(row, "parent_chat_id", source, line,
                          "expected an integer: -1 for a root, else the chat_id of an earlier row")
        ts = _timestamp(row, source, line, "seconds")
        clock.tick(ts, row["timestamp"], line)
        n_in = _tokens(row, "input_length", source, line)
        n_out = _tokens(row, "output_length", source, line)
        if limits is not None:
            limits.check(source, line, "input_length + output_length", "", n_in, n_out)
        kind = row.get("type", "")
        if not isinstance(kind, str):
            _fail(source, line, "type", f"got {kind!r}",
                  "expected a string such as \"text\", \"search\", \"image\" or \"file\"")
        if "turn" in row and type(row["turn"]) is not int:
            _fail(source, line, "turn", f"got {row['turn']!r}", "expected an integer")
        if cid in where:
            _fail(source, line, "chat_id", f"duplicate chat id {cid} (lines {where[cid][2]} "
                  f"and {line})", "chat ids must be unique within a file")
        blocks = _blocks(row, n_in, block, ids, source, line)
        if parent == -1:
            groups.append((line, cid, ts, []))
            w, p = len(groups) - 1, -1
            tool = 0.0
        else:
            found = where.get(parent)
            if found is None:
                _fail(source, line, "parent_chat_id", f"{parent} is not the chat_id of an "
                      "earlier row", "expected -1 for a root, else the chat_id of a row "
                      "earlier in the file")
            w, p, _ = found
            tool = ts - groups[w][3][p][7]  # >= 0: timestamps never decrease
        calls = groups[w][3]
        where[cid] = (w, len(calls), line)
        calls.append((cid, p, n_in, n_out, tool, kind, blocks, ts))
    workflows = []
    for line, root, arrival, rows in groups:
        children: list[list[int]] = [[] for _ in rows]
        for i, r in enumerate(rows):
            if r[1] >= 0:
                children[r[1]].append(i)
        own = own_hit_tokens([r[6] for r in rows], [r[2] for r in rows], block)
        calls = tuple(
            CallSpec(id=str(cid), parents=(p,) if p >= 0 else (), children=tuple(children[i]),
                     input_tokens=n_in, output_tokens=n_out, tool_latency_s=tool, kind=kind,
                     blocks=blocks, own_hit=own[i])
            for i, (cid, p, n_in, n_out, tool, kind, blocks, _) in enumerate(rows))
        workflows.append(WorkflowSpec(workflow_id=f"{name}/{root}", source="bailian",
                                      calls=calls, arrival_s=arrival, line=line,
                                      block_tokens=block, app_id=f"bailian/{rows[0][5]}"))
    return tuple(workflows)
