"""Workflow DAGs and agentic traces: the data the simulator serves.

A workflow is a DAG of LLM calls listed in topological order. Only its source calls are visible at
arrival; a child is revealed at ``max(parent finish) + tool_latency_s``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from dataclasses import field as dc_field
from importlib import resources
from pathlib import Path
from typing import Any

from hexagent_gym.config import suggest
from hexagent_gym.workload.lazy_trace import LazyWorkflows, MooncakeStore, WorkflowStore
from hexagent_gym.workload.specs import (
    CallSpec,
    TraceError,
    TraceLimits,
    WorkflowSpec,
    _where,
    decode_line,
)
from hexagent_gym.workload.trace_lines import LineIndex
from hexagent_gym.workload.workflow_parser import parse_workflow_object

# --------------------------------------------------------------------------------------------------
# Loading and validating traces (JSONL schema: docs/traces.md)
# --------------------------------------------------------------------------------------------------

__all__ = ["TRACE_NAMES", "CallSpec", "Trace", "TraceError", "TraceLimits", "WorkflowSpec",
           "check_kv_demand", "load_trace", "make_workflow", "open_trace", "parse_workflow"]

TRACE_NAMES = ("sharegpt", "bfcl_v3", "lats", "mixed", "agent_sessions")
"""Names of the traces shipped in ``hexagent_gym/data/traces`` (as gzip-compressed JSONL)."""

_ALIASES = {"bfcl-v3": "bfcl_v3", "bfcl": "bfcl_v3", "bfclv3": "bfcl_v3"}
_TRACE_SUFFIXES = (".jsonl", ".jsonl.gz", ".gz", ".json")


@dataclass(frozen=True)
class Trace:
    """A parsed trace: an immutable sequence of workflows plus where it came from.

    ``workflows`` is a tuple (:func:`load_trace`) or a :class:`~hexagent_gym.workload.lazy_trace.
    LazyWorkflows` that parses each workflow when first read (:func:`open_trace`). Two traces
    compare equal when their names and workflows are equal, wherever the files were
    (``source`` is excluded from ``==``), so a ``.jsonl`` and its ``.jsonl.gz`` copy are equal.
    """

    name: str
    """Shipped trace name (``lats``) or, for a user file, the file name without ``.jsonl[.gz]``."""
    source: str = dc_field(compare=False)
    """Path of the file the trace was read from (used in error messages)."""
    workflows: Sequence[WorkflowSpec]
    """Workflows in file order."""

    @property
    def num_calls(self) -> int:
        """Total number of LLM calls over all workflows."""
        return sum(len(w.calls) for w in self.workflows)

    def __len__(self) -> int:
        return len(self.workflows)


def load_trace(name_or_path: str | Path, block_tokens: int | None = None, *,
               max_context_tokens: int | None = None,
               max_kv_tokens: int | None = None) -> Trace:
    """Load a trace by shipped name or by path, validating every workflow.

    Args:
        name_or_path: a shipped name from ``TRACE_NAMES`` (case-insensitive; ``bfcl-v3`` and
            ``bfcl`` also mean ``bfcl_v3``) or the path of a ``.jsonl`` / ``.jsonl.gz`` file
            (gzip is chosen by the ``.gz`` extension) in our schema or in one of the public
            formats of ``hexagent_gym.workload.trace_formats`` (Mooncake, Qwen-Bailian), detected
            from the first row's keys.
        block_tokens: tokens per prompt block for files that carry no block size of their own
            (None: 512). Files with hash ids keep the block size of their format.
        max_context_tokens: the model's context length: a call whose input + output exceeds
            it is an error (None: no such bound).
        max_kv_tokens: the largest decode KV capacity of the cluster: a call whose input +
            output exceeds it is an error (None: no such bound).

    Every value is checked before anything is allocated from it (``specs.MAX_TOKENS``,
    ``MAX_SECONDS``, ``MAX_LINE_BYTES``, ``MAX_WORKFLOW_BLOCKS`` and the two bounds above), and
    the file is read line by line (its text is never held whole).

    Returns:
        The parsed trace. Results are cached per resolved path, modification time, block size
        and bounds, so loading the same unchanged file twice returns the same (immutable) object.

    Raises:
        TraceError: unknown name, unreadable file, or any schema violation (the message names the
            file, the 1-based line and the field).
    """
    return _load_cached(*_key(name_or_path, block_tokens, max_context_tokens, max_kv_tokens))


def open_trace(name_or_path: str | Path, block_tokens: int | None = None, *,
               max_context_tokens: int | None = None,
               max_kv_tokens: int | None = None) -> Trace:
    """Like :func:`load_trace`, but a workflow is read and parsed only when first used.

    The trace's ``workflows`` is a :class:`~hexagent_gym.workload.lazy_trace.LazyWorkflows` (what
    each use reads: its module docstring): an episode of 10 workflows from a 200k-line file reads
    the line offsets and parses 10 lines. Only the lines read are validated. Qwen-Bailian files
    are parsed whole (a conversation's rows may lie anywhere after its root). Cached like
    :func:`load_trace`; the parsed workflows are shared by every bound.

    Raises:
        TraceError: as :func:`load_trace`, for the file and for every line when it is read.
    """
    return _open_cached(*_key(name_or_path, block_tokens, max_context_tokens, max_kv_tokens))


def parse_workflow(obj: Any, source: str = "<dict>", line: int = 0) -> WorkflowSpec:
    """Build one workflow from a decoded JSON object, with the same checks as ``load_trace``.

    Args:
        obj: one line of a trace file, already decoded (a dict with ``workflow_id`` and ``calls``).
        source: file name or label used in error messages.
        line: 1-based line number used in error messages (0: not from a file).

    Call and parent ids may be strings or integers; integers are converted with ``str``.
    """
    return parse_workflow_object(obj, source, line, default_source="")


def make_workflow(calls: list[tuple[int, int, float, list[int]]],
                  workflow_id: str = "w") -> WorkflowSpec:
    """Build a small validated workflow in code (for tests and examples).

    Args:
        calls: one ``(input_tokens, output_tokens, tool_latency_s, parent_indices)`` per call, in
            topological order; call ``i`` gets the id ``str(i)``.
        workflow_id: the workflow's id.
    """
    obj = {
        "workflow_id": workflow_id,
        "calls": [
            {"id": str(i), "parents": [str(p) for p in parents], "input_tokens": n_in,
             "output_tokens": n_out, "tool_latency_s": tool}
            for i, (n_in, n_out, tool, parents) in enumerate(calls)
        ],
    }
    return parse_workflow_object(obj, "<make_workflow>", 0, default_source="")


def check_kv_demand(trace_or_workflows: Trace | Iterable[WorkflowSpec], max_kv_tokens: int,
                    source: str | None = None, groups: bool = False) -> None:
    """Fail early if some call can never be admitted to any decode instance.

    A call's KV demand is ``input_tokens + output_tokens``; it must fit the largest KV capacity of
    any decode instance, otherwise the simulation could never finish it. With ``groups`` a sample
    group decodes as one request: its leader's demand is the prompt plus every sample's output.

    Args:
        trace_or_workflows: a ``Trace`` or any iterable of workflows.
        max_kv_tokens: the largest KV capacity (tokens) over all decode instances of the cluster.
        source: file name for the message; defaults to the trace's path (or ``<workflows>``).

    Raises:
        TraceError: naming the file, line, workflow id, call id and field of the first call that
            does not fit, plus how many calls in total do not fit.
        ValueError: ``max_kv_tokens`` is not a positive integer.
    """
    if isinstance(max_kv_tokens, bool) or not isinstance(max_kv_tokens, int) or max_kv_tokens <= 0:
        raise ValueError(f"max_kv_tokens must be a positive integer, got {max_kv_tokens!r}")
    if isinstance(trace_or_workflows, Trace):
        workflows: Iterable[WorkflowSpec] = trace_or_workflows.workflows
        source = source if source is not None else trace_or_workflows.source
    else:
        workflows = trace_or_workflows
    source = source if source is not None else "<workflows>"
    first: tuple[WorkflowSpec, int, CallSpec] | None = None
    n_bad = 0
    largest = 0
    for wf in workflows:
        for i, call in enumerate(wf.calls):
            demand = call.input_tokens + call.output_tokens
            if groups and call.riders:
                demand += sum(wf.calls[r].output_tokens for r in call.riders)
            if demand > max_kv_tokens:
                n_bad += 1
                largest = max(largest, demand)
                if first is None:
                    first = (wf, i, call)
    if first is None:
        return
    wf, i, call = first
    others = f" ({n_bad} calls exceed it, the largest needs {largest})" if n_bad > 1 else ""
    raise TraceError(
        f"{_where(source, wf.line)}field 'calls[{i}].input_tokens + output_tokens': workflow "
        f"'{wf.workflow_id}', call '{call.id}' needs {call.input_tokens} + {call.output_tokens} = "
        f"{call.input_tokens + call.output_tokens} KV tokens, which exceeds every decode "
        f"instance's KV capacity of {max_kv_tokens} tokens{others}; use a cluster whose decode "
        f"instances hold at least {largest} tokens (more memory, TP or a smaller model) or drop "
        f"such workflows from the trace"
    )


# ---- name / path resolution ----------------------------------------------------------------------

def _resolve_trace(name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path.resolve()
    text = str(name_or_path)
    looks_like_path = (isinstance(name_or_path, Path) or "/" in text or "\\" in text
                       or text.lower().endswith(_TRACE_SUFFIXES))
    if looks_like_path:
        problem = "is not a file" if path.exists() else "does not exist"
        raise TraceError(f"trace file '{path}' {problem}; pass an existing .jsonl or "
                         f".jsonl.gz file or one of the shipped names: {', '.join(TRACE_NAMES)}")
    key = text.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in TRACE_NAMES:
        raise TraceError(f"unknown trace '{name_or_path}'; known: {', '.join(TRACE_NAMES)}."
                         f"{suggest(key, list(TRACE_NAMES))} (or pass a path to a .jsonl or "
                         f".jsonl.gz file)")
    shipped = resources.files("hexagent_gym") / "data" / "traces" / f"{key}.jsonl.gz"
    shipped_path = Path(str(shipped))
    if not shipped_path.is_file():
        raise TraceError(f"shipped trace file '{shipped_path}' is missing; reinstall hexagent-gym "
                         f"or pass a path to a .jsonl file")
    return shipped_path.resolve()


def _trace_name_of(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".jsonl", ".json"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    return name or path.name


def _key(name_or_path: str | Path, block_tokens: int | None, max_context_tokens: int | None,
         max_kv_tokens: int | None) -> tuple:
    """The cache key of a load: resolved path, modification time and size (an edited file is
    read again), trace name, block size and bounds."""
    if block_tokens is not None and (isinstance(block_tokens, bool)
                                     or not isinstance(block_tokens, int) or block_tokens < 1):
        raise TraceError(f"block_tokens must be an integer >= 1 or None (512), got "
                         f"{block_tokens!r}")
    limits = (TraceLimits(max_context_tokens, max_kv_tokens)
              if max_context_tokens is not None or max_kv_tokens is not None else None)
    path = _resolve_trace(name_or_path)
    try:
        stat = path.stat()
    except OSError as exc:
        raise TraceError(f"cannot read trace file '{path}': {exc.strerror}") from exc
    return str(path), stat.st_mtime_ns, stat.st_size, _trace_name_of(path), block_tokens, limits


@functools.lru_cache(maxsize=16)
def _load_cached(path: str, mtime_ns: int, size: int, name: str, block_tokens: int | None,
                 limits: TraceLimits | None) -> Trace:
    del mtime_ns, size  # only part of the cache key
    from hexagent_gym.workload.trace_formats import parse_public_rows

    fmt, index = _open_file(Path(path))
    if fmt is not None:
        rows = ((lineno, decode_line(raw, path, lineno)) for _, lineno, raw in index.all_lines())
        workflows = parse_public_rows(fmt, rows, path, name, limits)
    else:
        workflows = tuple(WorkflowStore(index, name, block_tokens).iterate(limits))
    return Trace(name=name, source=path, workflows=workflows)


@functools.lru_cache(maxsize=16)
def _store_cached(path: str, mtime_ns: int, size: int, name: str,
                  block_tokens: int | None) -> WorkflowStore | None:
    """The file's store of parsed workflows (None: a Qwen-Bailian file, parsed whole)."""
    del mtime_ns, size  # only part of the cache key
    fmt, index = _open_file(Path(path))
    if fmt == "bailian":
        return None
    return (MooncakeStore if fmt == "mooncake" else WorkflowStore)(index, name, block_tokens)


@functools.lru_cache(maxsize=16)
def _open_cached(path: str, mtime_ns: int, size: int, name: str, block_tokens: int | None,
                 limits: TraceLimits | None) -> Trace:
    store = _store_cached(path, mtime_ns, size, name, block_tokens)
    if store is None:
        return _load_cached(path, mtime_ns, size, name, block_tokens, limits)
    return Trace(name=name, source=path, workflows=LazyWorkflows(store, None, limits))


# ---- parsing -------------------------------------------------------------------------------------

def _open_file(path: Path) -> tuple[str | None, LineIndex]:
    """The file's format (None: our schema) from its first row, and its line index (one row
    read); an empty file is an error."""
    from hexagent_gym.workload.trace_formats import format_of_row

    index = LineIndex(path)
    if index.ensure(1) == 0:
        raise TraceError(f"{path}: the trace file is empty (no workflows); expected one JSON "
                         f"object per line, see the schema in the traces README")
    (_, lineno, raw), = index.lines([0])
    try:
        first = decode_line(raw, str(path), lineno)
    except TraceError:
        return None, index  # our parser reports it when it reads the line
    return format_of_row(first), index
