"""Parsing one workflow object of a JSONL trace into a validated :class:`WorkflowSpec`: ids,
lengths, tool latencies, the DAG (parents must come first, no cycles) and the prompt identity
(shared prefixes, templates, hash ids, sample groups), with errors naming file, line and field
(schema: docs/traces.md).
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

import networkx as nx

from hexagent_gym.workload.prompts import (
    DEFAULT_BLOCK_TOKENS,
    TEMPLATE_PREFIX_TOKENS,
    BlockIds,
    derive_blocks,
    num_blocks,
    own_hit_tokens,
)
from hexagent_gym.workload.specs import (
    MAX_SECONDS,
    MAX_TOKENS,
    MAX_WORKFLOW_BLOCKS,
    CallSpec,
    TraceError,
    TraceLimits,
    WorkflowSpec,
    _fail,
    _where,
)


def _as_id(value: Any) -> str | None:
    """A valid id (non-empty string, or integer converted to str) or None."""
    if isinstance(value, str):
        return value if value else None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


_DEFAULT_IDS = BlockIds()  # for workflows parsed one at a time (parse_workflow, make_workflow)


def parse_workflow_object(obj: Any, source: str, line: int, default_source: str,
                          ids: BlockIds | None = None, block_tokens: int | None = None,
                          limits: TraceLimits | None = None) -> WorkflowSpec:
    """One decoded workflow line as a validated :class:`WorkflowSpec`.

    Every value is checked (type, finiteness, range, ``limits``) before anything is allocated
    from it: the calls' block ids are built last, from bounded counts (``MAX_TOKENS`` per count,
    ``MAX_WORKFLOW_BLOCKS`` per workflow). ``ids`` is the trace's block-id allocator (None: a
    process-wide one), ``block_tokens`` the default block size (None: 512).

    Raises:
        TraceError: naming ``source``, ``line`` and the field, with the valid range.
    """
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

    meta = obj.get("meta", {})
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        _fail(source, line, "meta", f"must be an object, got {type(meta).__name__}",
              "e.g. {\"category\": \"simple\"}, or leave it out")
    app_id = _app_id(obj, meta, wf_source if "source" in obj else "", source, line)
    prefix_key = meta.get("system_prefix_key", "")
    prefix_key = "" if prefix_key is None else str(prefix_key)

    arrival = obj.get("arrival_s")
    if arrival is not None:
        if (isinstance(arrival, bool) or not isinstance(arrival, int | float)
                or not math.isfinite(arrival) or not 0 <= arrival <= MAX_SECONDS):
            _fail(source, line, "arrival_s", f"invalid arrival time {arrival!r}",
                  f"expected a finite number of seconds >= 0 (at most {MAX_SECONDS:.0e}), or null "
                  "to draw arrivals")
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
        if limits is not None:
            limits.check(source, line, f"{f}.input_tokens + output_tokens", f"call '{cid}' ",
                         n_in, n_out)
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
    # derive_blocks builds (input + output) // block ids per call plus a partial one: bound it
    need = sum((x[1] + x[2]) // block + 1 for x in fields)
    if need > MAX_WORKFLOW_BLOCKS:
        _fail(source, line, "calls", f"the calls need {need:,} prompt blocks of {block} tokens",
              f"a workflow may need at most {MAX_WORKFLOW_BLOCKS:,}: use a larger block size "
              "(prefix_block_tokens, hash_block_tokens) or split the workflow")
    prompts, own, group, riders = _prompt_identity(obj, raw_calls, fields, parents_of, index_of,
                                                   ids or _DEFAULT_IDS, block, source, line)
    calls = tuple(
        CallSpec(id=cid, parents=parents_of[i], children=tuple(children[i]), input_tokens=n_in,
                 output_tokens=n_out, tool_latency_s=tool, kind=kind, blocks=prompts[i],
                 own_hit=own[i], group=group[i], riders=riders[i])
        for i, (cid, n_in, n_out, tool, kind) in enumerate(fields)
    )
    return WorkflowSpec(workflow_id=workflow_id, source=wf_source, calls=calls, arrival_s=arrival,
                        line=line, block_tokens=block, app_id=app_id, prefix_key=prefix_key,
                        meta=meta)


def _app_id(obj: dict, meta: dict, named_source: str, source: str, line: int) -> str:
    """The workflow's application id: its ``app_id`` key, else ``<source>/<meta.category>``,
    else the ``source`` the file names ("" when the file names none)."""
    if "app_id" in obj:
        value = obj["app_id"]
        if not isinstance(value, str):
            _fail(source, line, "app_id", f"must be a string, got {value!r}",
                  "e.g. \"my-agent\", or leave it out")
        return value
    category = meta.get("category")
    if isinstance(category, str) and category and named_source:
        return f"{named_source}/{category}"
    return named_source


def _positive_int(value: Any) -> bool:
    """An int (not a bool) in [1, MAX_TOKENS]: every token count a trace may give."""
    return type(value) is int and 1 <= value <= MAX_TOKENS


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
            _fail(source, line, field, f"got {value!r}", f"expected an integer in [1, "
                  f"{MAX_TOKENS:,}] (tokens per hash id, e.g. 512 for Mooncake, 16 for "
                  "Qwen-Bailian)")
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
                  f"expected an integer in [1, {MAX_TOKENS:,}] next to meta.system_prefix_key")
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
                      f"expected an integer in [1, {MAX_TOKENS:,}] next to shared_prefix_key")
            shared[i] = (("shared", str(call["shared_prefix_key"])), tokens)
        if "hash_ids" in call:
            given[i] = _hash_ids(call["hash_ids"], n_in, block, source, line, f, cid)
        if "sample_group" in call:
            key = call["sample_group"]
            if not isinstance(key, str | int) or isinstance(key, bool):
                _fail(source, line, f"{f}.sample_group", f"call '{cid}': got {key!r}",
                      "expected a string or integer naming the request (equal values: the n "
                      "samples of one request)")
            groups.setdefault(key, []).append(i)
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
    # exact type: rejects bools and floats such as 3.0
    if type(value) is not int or not 1 <= value <= MAX_TOKENS:
        _fail(source, line, f"{f}.{key}", f"call '{cid}': got {value!r}",
              f"expected an integer in [1, {MAX_TOKENS:,}] (a token count; floats such as 3.0 "
              "are not accepted)")
    return value


def _tool_latency(call: dict, source: str, line: int, f: str, cid: str) -> float:
    key = "tool_latency_s"
    if key not in call:
        _fail(source, line, f"{f}.{key}", f"call '{cid}': missing",
              "expected a finite number of seconds >= 0 (0 for no tool wait)")
    value = call[key]
    if (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
            or not 0 <= value <= MAX_SECONDS):
        _fail(source, line, f"{f}.{key}", f"call '{cid}': got {value!r}",
              f"expected a finite number of seconds >= 0 (at most {MAX_SECONDS:.0e}; 0 for no "
              "tool wait)")
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
