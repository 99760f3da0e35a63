"""Workflow DAGs and agentic traces: the data the simulator serves.

A workflow is a DAG of LLM calls listed in topological order. Only its source calls are visible at
arrival; a child is revealed at ``max(parent finish) + tool_latency_s``.
"""

from __future__ import annotations

import functools
import gzip
import math
from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import field as dc_field
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import networkx as nx

from hexagent_gym.config import suggest
from hexagent_gym.prompts import (
    DEFAULT_BLOCK_TOKENS,
    TEMPLATE_PREFIX_TOKENS,
    BlockIds,
    derive_blocks,
    num_blocks,
    own_hit_tokens,
)
from hexagent_gym.specs import CallSpec, TraceError, WorkflowSpec, _fail, _where, json_lines

# --------------------------------------------------------------------------------------------------
# Loading and validating traces (JSONL schema: docs/traces.md)
# --------------------------------------------------------------------------------------------------

TRACE_NAMES = ("sharegpt", "bfcl_v3", "lats", "mixed", "agent_sessions")
"""Names of the traces shipped in ``hexagent_gym/data/traces`` (as gzip-compressed JSONL)."""

_ALIASES = {"bfcl-v3": "bfcl_v3", "bfcl": "bfcl_v3", "bfclv3": "bfcl_v3"}
_TRACE_SUFFIXES = (".jsonl", ".jsonl.gz", ".gz", ".json")


@dataclass(frozen=True)
class Trace:
    """A parsed trace: an immutable tuple of workflows plus where it came from.

    Two traces compare equal when their names and workflows are equal, wherever the files were
    (``source`` is excluded from ``==``), so a ``.jsonl`` and its ``.jsonl.gz`` copy are equal.
    """

    name: str
    """Shipped trace name (``lats``) or, for a user file, the file name without ``.jsonl[.gz]``."""
    source: str = dc_field(compare=False)
    """Path of the file the trace was read from (used in error messages)."""
    workflows: tuple[WorkflowSpec, ...]
    """Workflows in file order."""

    @property
    def num_calls(self) -> int:
        """Total number of LLM calls over all workflows."""
        return sum(len(w.calls) for w in self.workflows)

    def __len__(self) -> int:
        return len(self.workflows)


def load_trace(name_or_path: str | Path, block_tokens: int | None = None) -> Trace:
    """Load a trace by shipped name or by path, validating every workflow.

    Args:
        name_or_path: a shipped name from ``TRACE_NAMES`` (case-insensitive; ``bfcl-v3`` and
            ``bfcl`` also mean ``bfcl_v3``) or the path of a ``.jsonl`` / ``.jsonl.gz`` file
            (gzip is chosen by the ``.gz`` extension) in our schema or in one of the public
            formats of ``hexagent_gym.trace_formats`` (Mooncake, Qwen-Bailian), detected from
            the first row's keys.
        block_tokens: tokens per prompt block for files that carry no block size of their own
            (None: 512). Files with hash ids keep the block size of their format.

    Returns:
        The parsed trace. Results are cached per resolved path, modification time and block
        size, so loading the same unchanged file twice returns the same (immutable) object.

    Raises:
        TraceError: unknown name, unreadable file, or any schema violation (the message names the
            file, the 1-based line and the field).
    """
    if block_tokens is not None and (isinstance(block_tokens, bool)
                                     or not isinstance(block_tokens, int) or block_tokens < 1):
        raise TraceError(f"block_tokens must be an integer >= 1 or None (512), got "
                         f"{block_tokens!r}")
    path = _resolve_trace(name_or_path)
    try:
        stat = path.stat()
    except OSError as exc:
        raise TraceError(f"cannot read trace file '{path}': {exc.strerror}") from exc
    name = _trace_name_of(path)
    return _load_cached(str(path), stat.st_mtime_ns, stat.st_size, name, block_tokens)


def parse_workflow(obj: Any, source: str = "<dict>", line: int = 0) -> WorkflowSpec:
    """Build one workflow from a decoded JSON object, with the same checks as ``load_trace``.

    Args:
        obj: one line of a trace file, already decoded (a dict with ``workflow_id`` and ``calls``).
        source: file name or label used in error messages.
        line: 1-based line number used in error messages (0: not from a file).

    Call and parent ids may be strings or integers; integers are converted with ``str``.
    """
    return _parse_workflow(obj, source, line, default_source="")


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
    return _parse_workflow(obj, "<make_workflow>", 0, default_source="")


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


@functools.lru_cache(maxsize=16)
def _load_cached(path: str, mtime_ns: int, size: int, name: str,
                 block_tokens: int | None) -> Trace:
    # mtime_ns and size are only part of the cache key: an edited file is parsed again.
    del mtime_ns, size
    return Trace(name=name, source=path, workflows=_parse_file(Path(path), name, block_tokens))


# ---- parsing -------------------------------------------------------------------------------------

def _read_text(path: Path) -> str:
    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except OSError as exc:  # includes gzip.BadGzipFile
        detail = exc.strerror or str(exc)
        raise TraceError(f"cannot read trace file '{path}': {detail}") from exc
    except EOFError as exc:
        raise TraceError(f"cannot read trace file '{path}': truncated gzip data") from exc
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not UTF-8 text at byte {exc.start}; trace files are JSONL "
                         f"(one UTF-8 JSON object per line)") from exc


def _parse_file(path: Path, name: str, block_tokens: int | None) -> tuple[WorkflowSpec, ...]:
    from hexagent_gym.trace_formats import detect_format, parse_public

    source = str(path)
    text = _read_text(path)
    fmt = detect_format(text, source)
    if fmt is not None:
        return parse_public(fmt, text, source, name)
    ids = BlockIds()
    workflows: list[WorkflowSpec] = []
    first_line: dict[str, int] = {}
    for lineno, obj in json_lines(text, source):
        wf = _parse_workflow(obj, source, lineno, default_source=name, ids=ids,
                             block_tokens=block_tokens)
        if workflows and wf.block_tokens != workflows[0].block_tokens:
            _fail(source, lineno, "hash_block_tokens", f"{wf.block_tokens} differs from "
                  f"{workflows[0].block_tokens} on line {workflows[0].line}",
                  "every workflow of one trace must use the same block size")
        earlier = first_line.get(wf.workflow_id)
        if earlier is not None:
            _fail(source, lineno, "workflow_id", f"duplicate workflow id '{wf.workflow_id}' (lines "
                  f"{earlier} and {lineno})", "workflow ids must be unique within a file")
        first_line[wf.workflow_id] = lineno
        workflows.append(wf)
    if not workflows:
        raise TraceError(f"{source}: the trace file is empty (no workflows); expected one JSON "
                         f"object per line, see the schema in the traces README")
    return tuple(workflows)


def _as_id(value: Any) -> str | None:
    """A valid id (non-empty string, or integer converted to str) or None."""
    if isinstance(value, str):
        return value if value else None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


_DEFAULT_IDS = BlockIds()  # for workflows parsed one at a time (parse_workflow, make_workflow)


def _parse_workflow(obj: Any, source: str, line: int, default_source: str,
                    ids: BlockIds | None = None, block_tokens: int | None = None) -> WorkflowSpec:
    if not isinstance(obj, dict):
        raise TraceError(f"{_where(source, line)}expected a JSON object (a workflow with "
                         f"'workflow_id' and 'calls'), got {type(obj).__name__}")
    if "workflow_id" not in obj:
        _fail(source, line, "workflow_id", "missing", "every workflow needs a unique string id")
    workflow_id = _as_id(obj["workflow_id"])
    if workflow_id is None:
        _fail(source, line, "workflow_id", f"invalid id {obj['workflow_id']!r}",
              "expected a non-empty string")

    wf_source = obj.get("source", default_source)
    if not isinstance(wf_source, str):
        _fail(source, line, "source", f"must be a string, got {wf_source!r}",
              "e.g. \"lats\", or leave it out")

    arrival = obj.get("arrival_s")
    if arrival is not None:
        if (isinstance(arrival, bool) or not isinstance(arrival, int | float)
                or not math.isfinite(arrival) or arrival < 0):
            _fail(source, line, "arrival_s", f"invalid arrival time {arrival!r}",
                  "expected a finite number of seconds >= 0, or null to draw arrivals")
        arrival = float(arrival)

    if "calls" not in obj:
        _fail(source, line, "calls", "missing", "expected a non-empty list of call objects")
    raw_calls = obj["calls"]
    if not isinstance(raw_calls, list) or not raw_calls:
        got = "an empty list" if isinstance(raw_calls, list) else repr(raw_calls)[:60]
        _fail(source, line, "calls", f"got {got}", "expected a non-empty list of call objects")

    index_of: dict[str, int] = {}
    parents_of: list[tuple[int, ...]] = []
    fields: list[tuple[str, int, int, float, str]] = []
    for i, call in enumerate(raw_calls):
        f = f"calls[{i}]"
        if not isinstance(call, dict):
            _fail(source, line, f, f"got {type(call).__name__}",
                  "each call must be a JSON object with id, parents, input_tokens, "
                  "output_tokens and tool_latency_s")
        if "id" not in call:
            _fail(source, line, f"{f}.id", "missing", "every call needs an id unique within "
                  "its workflow")
        cid = _as_id(call["id"])
        if cid is None:
            _fail(source, line, f"{f}.id", f"invalid id {call['id']!r}",
                  "expected a non-empty string")
        if cid in index_of:
            _fail(source, line, f"{f}.id", f"duplicate call id '{cid}' (also calls"
                  f"[{index_of[cid]}])", "call ids must be unique within a workflow")
        index_of[cid] = i
        n_in = _token_count(call, "input_tokens", source, line, f, cid)
        n_out = _token_count(call, "output_tokens", source, line, f, cid)
        tool = _tool_latency(call, source, line, f, cid)
        kind = call.get("kind", "")
        if not isinstance(kind, str):
            _fail(source, line, f"{f}.kind", f"call '{cid}': must be a string, got {kind!r}",
                  "e.g. \"chat\", or leave it out")
        parents = _parents(call, raw_calls, index_of, i, cid, source, line)
        parents_of.append(parents)
        fields.append((cid, n_in, n_out, tool, kind))

    children: list[list[int]] = [[] for _ in raw_calls]
    for i, parents in enumerate(parents_of):
        for p in parents:
            children[p].append(i)
    block = _block_size(obj, raw_calls, block_tokens, source, line)
    prompts, own, group, riders = _prompt_identity(obj, raw_calls, fields, parents_of, index_of,
                                                   ids or _DEFAULT_IDS, block, source, line)
    calls = tuple(
        CallSpec(id=cid, parents=parents_of[i], children=tuple(children[i]), input_tokens=n_in,
                 output_tokens=n_out, tool_latency_s=tool, kind=kind, blocks=prompts[i],
                 own_hit=own[i], group=group[i], riders=riders[i])
        for i, (cid, n_in, n_out, tool, kind) in enumerate(fields)
    )
    return WorkflowSpec(workflow_id=workflow_id, source=wf_source, calls=calls, arrival_s=arrival,
                        line=line, block_tokens=block)


def _positive_int(value: Any) -> bool:
    return type(value) is int and value >= 1


def _block_size(obj: dict, raw_calls: list, default: int | None, source: str,
                line: int) -> int:
    """The workflow's block size: ``hash_block_tokens`` (workflow or calls, all equal) or the
    loader's default."""
    found: int | None = None
    places = [("hash_block_tokens", obj)] + [
        (f"calls[{i}].hash_block_tokens", c) for i, c in enumerate(raw_calls)]
    for field, holder in places:
        if "hash_block_tokens" not in holder:
            continue
        value = holder["hash_block_tokens"]
        if not _positive_int(value):
            _fail(source, line, field, f"got {value!r}", "expected an integer >= 1 (tokens per "
                  "hash id, e.g. 512 for Mooncake, 16 for Qwen-Bailian)")
        if found is not None and value != found:
            _fail(source, line, field, f"{value} differs from {found} given earlier",
                  "one workflow has one block size")
        found = value
    if found is not None:
        return found
    return DEFAULT_BLOCK_TOKENS if default is None else default


def _prompt_identity(obj: dict, raw_calls: list, fields: list, parents_of: list,
                     index_of: dict[str, int], ids: BlockIds, block: int, source: str,
                     line: int) -> tuple[list, list, list, list]:
    """Validate the optional reuse fields and derive block ids, own hits and sample groups."""
    n = len(raw_calls)
    prefix_of = [-1] * n
    prefix_tokens = [0] * n
    shared: list[tuple[Any, int] | None] = [None] * n
    given: list[list[int] | None] = [None] * n
    meta = obj.get("meta")
    system: tuple[Any, int] | None = None
    if isinstance(meta, dict) and "system_prefix_key" in meta:
        tokens = meta.get("system_prefix_tokens")
        if not _positive_int(tokens):
            _fail(source, line, "meta.system_prefix_tokens", f"got {tokens!r}",
                  "expected an integer >= 1 next to meta.system_prefix_key")
        system = (("system", str(meta["system_prefix_key"])), tokens)
    groups: dict[Any, list[int]] = {}
    for i, call in enumerate(raw_calls):
        f = f"calls[{i}]"
        cid, n_in, n_out = fields[i][0], fields[i][1], fields[i][2]
        if "prefix_of" in call:
            pid = _as_id(call["prefix_of"])
            p = index_of.get(pid) if pid is not None else None
            if p is None or p >= i:
                _fail(source, line, f"{f}.prefix_of", f"call '{cid}': {call['prefix_of']!r} is "
                      "not an earlier call of this workflow", "expected the id of a call listed "
                      "before this one")
            reuse = call.get("prefix_tokens")
            if type(reuse) is not int or not 0 <= reuse <= n_in:
                _fail(source, line, f"{f}.prefix_tokens", f"call '{cid}': got {reuse!r}",
                      f"expected an integer in [0, input_tokens = {n_in}] next to prefix_of")
            prefix_of[i] = p
            # LATS gives approximate counts (a few tokens over the parent's input + output)
            prefix_tokens[i] = min(reuse, fields[p][1] + fields[p][2])
        shared[i] = system
        template = call.get("template")
        if isinstance(template, str) and template in TEMPLATE_PREFIX_TOKENS:
            shared[i] = (("template", template), TEMPLATE_PREFIX_TOKENS[template])
        if "shared_prefix_key" in call:
            tokens = call.get("shared_prefix_tokens")
            if not _positive_int(tokens):
                _fail(source, line, f"{f}.shared_prefix_tokens", f"call '{cid}': got {tokens!r}",
                      "expected an integer >= 1 next to shared_prefix_key")
            shared[i] = (("shared", str(call["shared_prefix_key"])), tokens)
        if "hash_ids" in call:
            given[i] = _hash_ids(call["hash_ids"], n_in, block, source, line, f, cid)
        if "sample_group" in call:
            groups.setdefault(call["sample_group"], []).append(i)
        del n_out
    prompts = derive_blocks(ids, block, [x[1] for x in fields], [x[2] for x in fields],
                            prefix_of, prefix_tokens, shared, given)
    group = [-1] * n
    riders: list[tuple[int, ...]] = [()] * n
    for key, members in groups.items():
        lead = members[0]
        for m in members[1:]:
            if (parents_of[m], fields[m][1], fields[m][3]) != (
                    parents_of[lead], fields[lead][1], fields[lead][3]):
                _fail(source, line, f"calls[{m}].sample_group", f"call '{fields[m][0]}' is in "
                      f"sample group {key!r} with call '{fields[lead][0]}' but differs in "
                      "parents, input_tokens or tool_latency_s", "the samples of one request "
                      "share parents, prompt and tool wait; give it another sample_group")
            prompts[m] = prompts[lead]
        if len(members) > 1:
            for m in members:
                group[m] = lead
            riders[lead] = tuple(members[1:])
    own = own_hit_tokens(prompts, [x[1] for x in fields], block)
    return prompts, own, group, riders


def _hash_ids(value: Any, n_in: int, block: int, source: str, line: int, f: str,
              cid: str) -> list[int]:
    limit = num_blocks(n_in, block)
    if not isinstance(value, list) or any(type(v) is not int for v in value):
        _fail(source, line, f"{f}.hash_ids", f"call '{cid}': got {repr(value)[:60]}",
              "expected a list of integer block ids")
    if len(value) > limit:
        _fail(source, line, f"{f}.hash_ids", f"call '{cid}': {len(value)} ids but "
              f"input_tokens = {n_in} fills only {limit} blocks of {block} tokens",
              f"give at most ceil(input_tokens / {block}) ids (or set hash_block_tokens)")
    return value


def _token_count(call: dict, key: str, source: str, line: int, f: str, cid: str) -> int:
    if key not in call:
        _fail(source, line, f"{f}.{key}", f"call '{cid}': missing", "expected an integer >= 1")
    value = call[key]
    if type(value) is not int or value < 1:  # exact type: rejects bools and floats such as 3.0
        _fail(source, line, f"{f}.{key}", f"call '{cid}': got {value!r}",
              "expected an integer >= 1 (a token count; floats such as 3.0 are not accepted)")
    return value


def _tool_latency(call: dict, source: str, line: int, f: str, cid: str) -> float:
    key = "tool_latency_s"
    if key not in call:
        _fail(source, line, f"{f}.{key}", f"call '{cid}': missing",
              "expected a finite number of seconds >= 0 (0 for no tool wait)")
    value = call[key]
    if (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
            or value < 0):
        _fail(source, line, f"{f}.{key}", f"call '{cid}': got {value!r}",
              "expected a finite number of seconds >= 0 (0 for no tool wait)")
    return float(value)


def _parents(call: dict, raw_calls: list, index_of: dict[str, int], i: int, cid: str,
             source: str, line: int) -> tuple[int, ...]:
    f = f"calls[{i}].parents"
    if "parents" not in call:
        _fail(source, line, f, f"call '{cid}': missing",
              "expected a list of ids of earlier calls ([] for a source call)")
    raw = call["parents"]
    if not isinstance(raw, list):
        _fail(source, line, f, f"call '{cid}': got {raw!r}",
              "expected a list of ids of earlier calls ([] for a source call)")
    out: list[int] = []
    for value in raw:
        pid = _as_id(value)
        if pid is None:
            _fail(source, line, f, f"call '{cid}': invalid parent id {value!r}",
                  "expected call ids (non-empty strings)")
        p = index_of.get(pid)
        if p is None or p == i:
            _diagnose_parent(raw_calls, i, cid, pid, source, line)
        if p in out:
            _fail(source, line, f, f"call '{cid}': parent '{pid}' is listed twice",
                  "list each parent once")
        out.append(p)
    return tuple(sorted(out))


def _diagnose_parent(raw_calls: list, i: int, cid: str, pid: str, source: str,
                     line: int) -> NoReturn:
    """Explain a parent id that is not an earlier call: a cycle, a misordered file, or unknown."""
    f = f"calls[{i}].parents"
    ids = [_as_id(c.get("id")) if isinstance(c, dict) else None for c in raw_calls]
    if pid not in ids:
        known = [x for x in ids[:i] if x is not None]
        shown = ", ".join(f"'{x}'" for x in known[:10]) + (", ..." if len(known) > 10 else "")
        earlier = shown or "none: this is the first call, so its parents must be []"
        _fail(source, line, f, f"call '{cid}': unknown parent id '{pid}'",
              f"parents must be ids of earlier calls of this workflow ({earlier})")
    # The parent exists but is this call or a later one: report a cycle if there is one.
    graph = nx.DiGraph()
    for c, child in zip(raw_calls, ids, strict=True):
        if child is None or not isinstance(c, dict) or not isinstance(c.get("parents"), list):
            continue
        for value in c["parents"]:
            parent = _as_id(value)
            if parent is not None and parent in ids:
                graph.add_edge(parent, child)
    if not nx.is_directed_acyclic_graph(graph):
        try:
            cycle = nx.find_cycle(graph, source=pid)
        except nx.NetworkXNoCycle:
            cycle = nx.find_cycle(graph)
        nodes = [u for u, _ in cycle]
        if cid in nodes:  # start the path at the call being reported
            k = nodes.index(cid)
            nodes = nodes[k:] + nodes[:k]
        path = " -> ".join([*nodes, nodes[0]])
        _fail(source, line, f, f"call '{cid}': the calls form a cycle: {path} (each arrow points "
              "from a parent to its child)", "a workflow must be a DAG: no call may depend on "
              "itself, directly or indirectly")
    _fail(source, line, f, f"call '{cid}': parent '{pid}' is listed after this call (as "
          f"calls[{ids.index(pid)}])", "calls must be in topological order, every parent listed "
          f"before its children; move call '{pid}' above call '{cid}' in 'calls'")
