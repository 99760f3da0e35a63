"""The immutable data a trace parses into: calls, workflows, and the trace error type."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

from hexagent_gym.workload.prompts import DEFAULT_BLOCK_TOKENS


class TraceError(ValueError):
    """A trace file or workflow is invalid.

    The message reads ``<file>:<line>: field '<field>': <what is wrong>; <what would be valid>``.
    """


@dataclass(frozen=True, slots=True)
class CallSpec:
    """One LLM call of a workflow, as the trace gives it (true values, no estimation error)."""

    id: str
    """Id unique within the workflow (the trace's ``id``)."""
    parents: tuple[int, ...]
    """Indices (into ``WorkflowSpec.calls``) of the calls this one waits for."""
    children: tuple[int, ...]
    """Indices of the calls that wait for this one (derived from ``parents``)."""
    input_tokens: int
    """Prompt length L_in in tokens (> 0)."""
    output_tokens: int
    """True generated length L_out in tokens (> 0)."""
    tool_latency_s: float
    """Tool/external wait after the last parent finishes, seconds (>= 0)."""
    kind: str = ""
    """Free-form label from the trace (``chat``, ``fc_step``, ``expand`` ...)."""
    blocks: tuple[int, ...] = field(default=(), compare=False)
    """Prompt block ids (``hexagent_gym.workload.prompts``): ``ceil(input_tokens / block_tokens)``
    ids of the workflow's block size; equal ids at equal positions are reusable prompt KV. Empty
    only for specs built by hand: such a call shares nothing. Ids are allocated per load, so they do
    not take part in ``==`` (they only ever compare with ids of the same load)."""
    own_hit: int = 0
    """Prompt tokens that calls listed earlier in the same workflow already hold (the hit it can
    expect when its workflow runs alone on a cold cache)."""
    group: int = -1
    """Sample group (``n > 1`` request): index of the group's leader, which is the group's first
    call; -1 when the call is not in a group. Members share one prompt and one prefill."""
    riders: tuple[int, ...] = ()
    """On a group leader: indices of the other members (they ride its prefill)."""


@dataclass(frozen=True, slots=True)
class WorkflowSpec:
    """One workflow (agentic program) of a trace."""

    workflow_id: str
    source: str
    calls: tuple[CallSpec, ...]
    """Calls in topological order: every parent index is smaller than its child's index."""
    arrival_s: float | None = None
    """Arrival time from the file, or None when the simulator draws arrivals."""
    line: int = 0
    """1-based line of the trace file this workflow came from (0 when built in code)."""
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    """Tokens per prompt block of the calls' ``blocks``."""
    app_id: str = ""
    """The application id a client sends with the request (docs/horizons.md): the trace's own
    ``app_id`` key, else ``<source>/<meta.category>`` (BFCL), else the ``source`` the file
    names (``lats``, ``sharegpt``), ``mooncake``, ``bailian/<type>``; "" when unknown."""
    prefix_key: str = ""
    """Identity of the workflow's system prompt (BFCL's ``meta.system_prefix_key``): visible in
    the first prompt; "" when the trace has none."""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """The trace's ``meta`` object as loaded (never modified). Most of it describes the
    workflow's future (turns, tool errors): schedulers read only ``app_id`` and ``prefix_key``
    (docs/horizons.md lists what is visible when)."""


MAX_TOKENS = 10_000_000
"""Upper bound of any token count a trace may give (prompt or output; ~40x the longest context of
a served model here), checked before anything is allocated from it: a typo such as 10**12
must be an error naming the line, not a multi-gigabyte list of block ids."""


MAX_SECONDS = 1e9
"""Upper bound of any time a trace gives (arrival, tool wait, timestamp; ~31 years): beyond it a
float64 time's resolution is coarser than a microsecond, so the simulator's sub-millisecond
steps would round away."""

MAX_LINE_BYTES = 8 * 2**20
"""Longest line (bytes) a trace may hold, checked while the line is being found, before it is
decoded: 180x the longest shipped workflow (46 KB); a longer line is almost surely not one
workflow and would make ``json.loads`` hold many times its size."""

MAX_WORKFLOW_BLOCKS = 2**22
"""Most prompt block ids one workflow may need (sum over its calls of ``(input + output) //
block_tokens`` plus one partial block each), checked before any is built: 4M ids are ~150 MB."""


@dataclass(frozen=True, slots=True)
class TraceLimits:
    """What the serving cluster can hold, checked per call before any block id is built.

    ``None`` leaves a bound out (``MAX_TOKENS`` always applies). A call needing more is a
    :class:`TraceError` naming the file, line, field and the valid range.
    """

    max_context_tokens: int | None = None
    """The model's context length: ``input + output`` of one call must not exceed it."""
    max_kv_tokens: int | None = None
    """The largest decode instance's KV capacity: ``input + output`` of one call must fit it (a
    sample group's wider demand is checked when the simulator is built)."""

    def __post_init__(self) -> None:
        for name in ("max_context_tokens", "max_kv_tokens"):
            v = getattr(self, name)
            if v is not None and (type(v) is not int or v < 2):
                raise ValueError(f"{name} must be an integer >= 2 or None, got {v!r}")

    def check(self, source: str, line: int, field: str, who: str, n_in: int, n_out: int) -> None:
        """Raise a TraceError when ``n_in + n_out`` exceeds a bound (``field`` names the sum)."""
        need = n_in + n_out
        for bound, what in ((self.max_context_tokens, "the model's context length"),
                            (self.max_kv_tokens, "the largest decode instance's KV capacity")):
            if bound is not None and need > bound:
                _fail(source, line, field, f"{who}needs {n_in} + {n_out} = {need} tokens, more "
                      f"than {what} ({bound:,} tokens)", f"valid: input + output in [2, "
                      f"{bound:,}]; use a cluster that holds it or drop the call")


def _where(source: str, line: int) -> str:
    return f"{source}:{line}: " if line else f"{source}: "


def _fail(source: str, line: int, field: str, problem: str, valid: str) -> NoReturn:
    raise TraceError(f"{_where(source, line)}field '{field}': {problem}; {valid}")


def decode_line(raw: bytes | str, source: str, lineno: int) -> Any:
    """Decode one JSONL line (bytes are UTF-8); every failure is a TraceError naming the line.

    Raises:
        TraceError: longer than ``MAX_LINE_BYTES``, not UTF-8, not JSON, or nested too deeply.
    """
    if len(raw) > MAX_LINE_BYTES:
        raise TraceError(f"{source}:{lineno}: line of {len(raw):,} bytes, longer than the "
                         f"{MAX_LINE_BYTES:,} bytes a trace line may hold; one line is one "
                         f"workflow (or one row)")
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(f"{source}:{lineno}: not UTF-8 text at byte {exc.start} of the "
                             f"line; trace files are UTF-8 JSONL") from None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{source}:{lineno}: invalid JSON: {exc.msg} (column {exc.colno}); "
                         f"each non-blank line must be one JSON object") from None
    except RecursionError:
        raise TraceError(f"{source}:{lineno}: JSON nested too deeply for the decoder; a "
                         f"workflow is a flat object of calls") from None


def json_lines(text: str, source: str) -> Iterator[tuple[int, Any]]:
    """Yield ``(line, decoded object)`` for every non-blank line of a JSONL text.

    Raises:
        TraceError: a line is not valid JSON (naming the file, line and column).
    """
    # split("\n") rather than splitlines(): JSON strings may contain U+2028 etc., which
    # splitlines() would treat as line breaks and so shift every later line number.
    for lineno, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        yield lineno, decode_line(raw, source, lineno)
