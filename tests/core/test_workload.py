"""Trace loading and validation (hexagent_gym.workload.workload)."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hexagent_gym.workload.workload import (
    TRACE_NAMES,
    Trace,
    TraceError,
    check_kv_demand,
    load_trace,
    make_workflow,
    parse_workflow,
)


def call(cid: str, parents: list[str] | None = None, n_in: object = 10, n_out: object = 5,
         tool: object = 0.0, **extra: object) -> dict:
    return {"id": cid, "parents": parents or [], "input_tokens": n_in, "output_tokens": n_out,
            "tool_latency_s": tool, **extra}


def wf(wid: str = "w0", calls: list[dict] | None = None, **extra: object) -> dict:
    return {"workflow_id": wid, "source": "test", "arrival_s": None,
            "calls": calls if calls is not None else [call("0")], **extra}


def write_lines(tmp_path: Path, lines: list[str | dict], name: str = "trace.jsonl") -> Path:
    """Write JSONL: dicts are dumped, strings are written verbatim (for broken lines)."""
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n"
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load_error(path: Path, line: int | None, field: str | None) -> str:
    """Load a broken file and check that the message names the file, line and field."""
    with pytest.raises(TraceError) as info:
        load_trace(path)
    msg = str(info.value)
    where = str(path.resolve())  # traces are cached and reported by their resolved path
    assert where in msg and path.name in msg
    if line is not None:
        assert f"{where}:{line}: " in msg
    if field is not None:
        assert f"field '{field}'" in msg
    return msg


# ---- shipped traces ----------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "n_workflows", "n_calls"), [
    ("sharegpt", 991, 3527), ("bfcl_v3", 3151, 12782), ("lats", 250, 28432), ("mixed", 600, 23052),
])
def test_shipped_traces_have_the_readme_counts(name: str, n_workflows: int, n_calls: int) -> None:
    trace = load_trace(name)
    assert trace.name == name
    assert trace.source.endswith(f"{name}.jsonl.gz")
    assert len(trace.workflows) == len(trace) == n_workflows
    assert trace.num_calls == n_calls
    for w in trace.workflows:
        for i, c in enumerate(w.calls):
            assert all(p < i for p in c.parents)
            assert all(j > i for j in c.children)
            assert c.input_tokens >= 1 and c.output_tokens >= 1 and c.tool_latency_s >= 0


def test_shipped_trace_contents_spot_check() -> None:
    lats = load_trace("lats")
    first = lats.workflows[0]
    assert first.workflow_id == "lats/hotpotqa_dev_28"
    assert first.source == "lats" and first.arrival_s is None and first.line == 1
    assert [c.kind for c in first.calls[:6]] == ["expand"] * 5 + ["value"]
    assert first.calls[5].parents == (0,) and first.calls[5].tool_latency_s == 0.89
    assert first.calls[9].parents == (5, 6, 7, 8)
    assert first.calls[0].children == (5,)
    mixed_sources = {w.source for w in load_trace("mixed").workflows}
    assert mixed_sources == {"sharegpt", "bfcl_v3", "lats"}


@pytest.mark.parametrize("alias", ["BFCL_V3", "bfcl-v3", "bfcl", " Bfcl_v3 "])
def test_name_aliases_and_case(alias: str) -> None:
    assert load_trace(alias) is load_trace("bfcl_v3")


def test_trace_names_constant() -> None:
    assert TRACE_NAMES == ("sharegpt", "bfcl_v3", "lats", "mixed", "agent_sessions")


def test_unknown_name_lists_known_names_and_suggests() -> None:
    with pytest.raises(TraceError) as info:
        load_trace("lat")
    msg = str(info.value)
    assert "unknown trace 'lat'" in msg
    assert all(n in msg for n in TRACE_NAMES)
    assert "Did you mean: `lats`?" in msg


def test_missing_path_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="does not exist"):
        load_trace(tmp_path / "nope.jsonl")
    with pytest.raises(TraceError, match="does not exist"):
        load_trace("nope.jsonl.gz")


# ---- parsing -----------------------------------------------------------------------------------

def diamond_obj() -> dict:
    return wf("diamond", [
        call("a", [], 100, 10, 0.0, kind="expand"),
        call("b", ["a"], 120, 20, 0.5, kind="value"),
        call("c", ["a"], 130, 30, 1.25),
        call("d", ["c", "b"], 200, 40, 0.0, kind="reflect"),
    ], arrival_s=2.5, meta={"anything": [1, 2]})


def test_diamond_parse_by_hand(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [diamond_obj()], name="diamond.jsonl")
    trace = load_trace(path)
    assert trace.name == "diamond" and trace.source == str(path.resolve())
    (w,) = trace.workflows
    assert (w.workflow_id, w.source, w.arrival_s, w.line) == ("diamond", "test", 2.5, 1)
    assert [c.id for c in w.calls] == ["a", "b", "c", "d"]
    assert [c.parents for c in w.calls] == [(), (0,), (0,), (1, 2)]
    assert [c.children for c in w.calls] == [(1, 2), (3,), (3,), ()]
    assert [c.input_tokens for c in w.calls] == [100, 120, 130, 200]
    assert [c.output_tokens for c in w.calls] == [10, 20, 30, 40]
    assert [c.tool_latency_s for c in w.calls] == [0.0, 0.5, 1.25, 0.0]
    assert all(isinstance(c.tool_latency_s, float) for c in w.calls)
    assert [c.kind for c in w.calls] == ["expand", "value", "", "reflect"]
    assert w == parse_workflow(diamond_obj(), line=1)


def test_make_workflow_builds_the_same_dag() -> None:
    w = make_workflow([(100, 10, 0.0, []), (120, 20, 0.5, [0]), (130, 30, 1.25, [0]),
                       (200, 40, 0.0, [1, 2])], workflow_id="d")
    assert w.workflow_id == "d"
    assert [c.id for c in w.calls] == ["0", "1", "2", "3"]
    assert [c.children for c in w.calls] == [(1, 2), (3,), (3,), ()]
    with pytest.raises(TraceError, match="calls\\[1\\].parents"):
        make_workflow([(1, 1, 0.0, []), (1, 1, 0.0, [1])])


def test_integer_ids_and_missing_source_and_arrival(tmp_path: Path) -> None:
    obj = {"workflow_id": 7, "calls": [call(0), call(1, [0])]}  # type: ignore[arg-type]
    w = load_trace(write_lines(tmp_path, [obj], name="ints.jsonl")).workflows[0]
    assert w.workflow_id == "7" and [c.id for c in w.calls] == ["0", "1"]
    assert w.source == "ints"  # defaults to the trace name
    assert w.arrival_s is None and w.calls[1].parents == (0,)


def test_gz_and_plain_paths_give_equal_traces(tmp_path: Path) -> None:
    lines = [diamond_obj(), "", wf("w1", [call("x"), call("y", ["x"], tool=0.2)])]
    plain = write_lines(tmp_path, lines, name="same.jsonl")
    packed = tmp_path / "same.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    a, b = load_trace(plain), load_trace(packed)
    assert a.source != b.source
    assert a == b
    assert a.workflows[1].line == 3  # the blank line counts
    # A .gz file that is not gzip data is reported, not crashed on.
    fake = tmp_path / "fake.jsonl.gz"
    fake.write_bytes(plain.read_bytes())
    with pytest.raises(TraceError, match="cannot read trace file"):
        load_trace(fake)


def test_cache_returns_same_object_until_the_file_changes(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [wf("w0")], name="cached.jsonl")
    first = load_trace(path)
    assert load_trace(str(path)) is first
    write_lines(tmp_path, [wf("w0"), wf("w1")], name="cached.jsonl")
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    second = load_trace(path)
    assert second is not first and len(second) == 2


# ---- validation errors ---------------------------------------------------------------------------

def test_bad_json_names_line(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [wf("w0"), '{"workflow_id": "w1", "calls": [}'])
    msg = load_error(path, 2, None)
    assert "invalid JSON" in msg and "column" in msg


def test_top_level_must_be_an_object(tmp_path: Path) -> None:
    msg = load_error(write_lines(tmp_path, ["[1, 2]"]), 1, None)
    assert "expected a JSON object" in msg and "list" in msg


def test_empty_file(tmp_path: Path) -> None:
    for text in ("", "\n\n  \n"):
        path = tmp_path / "empty.jsonl"
        path.write_text(text)
        with pytest.raises(TraceError, match="empty") as info:
            load_trace(path)
        assert str(path) in str(info.value)


def test_blank_lines_are_skipped_but_counted(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [wf("w0"), "", "   ", wf("w1", [call("0", n_in=0)])])
    load_error(path, 4, "calls[0].input_tokens")


@pytest.mark.parametrize("bad", [None, "", 1.5, [], {"a": 1}, True])
def test_invalid_workflow_id(tmp_path: Path, bad: object) -> None:
    load_error(write_lines(tmp_path, [wf(bad)]), 1, "workflow_id")  # type: ignore[arg-type]


def test_missing_workflow_id(tmp_path: Path) -> None:
    obj = wf()
    del obj["workflow_id"]
    msg = load_error(write_lines(tmp_path, [wf("ok"), obj]), 2, "workflow_id")
    assert "missing" in msg


def test_duplicate_workflow_id_names_both_lines(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [wf("a"), "", wf("b"), wf("a")])
    msg = load_error(path, 4, "workflow_id")
    assert "duplicate workflow id 'a'" in msg and "lines 1 and 4" in msg


@pytest.mark.parametrize(("calls", "what"), [
    (None, "missing"), ([], "empty list"), ({"0": {}}, "non-empty list"), ("x", "non-empty list"),
])
def test_calls_must_be_a_nonempty_list(tmp_path: Path, calls: object, what: str) -> None:
    obj = wf()
    if calls is None:
        del obj["calls"]
    else:
        obj["calls"] = calls
    assert what in load_error(write_lines(tmp_path, [obj]), 1, "calls")


def test_call_must_be_an_object(tmp_path: Path) -> None:
    load_error(write_lines(tmp_path, [wf(calls=[call("0"), 5])]), 1, "calls[1]")


def test_call_missing_id(tmp_path: Path) -> None:
    bad = call("1", ["0"])
    del bad["id"]
    msg = load_error(write_lines(tmp_path, [wf(calls=[call("0"), bad])]), 1, "calls[1].id")
    assert "missing" in msg


def test_duplicate_call_id(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [wf(calls=[call("0"), call("1", ["0"]), call("0", ["1"])])])
    msg = load_error(path, 1, "calls[2].id")
    assert "duplicate call id '0'" in msg and "calls[0]" in msg


def test_parents_must_be_a_list(tmp_path: Path) -> None:
    bad = call("1")
    bad["parents"] = "0"
    load_error(write_lines(tmp_path, [wf(calls=[call("0"), bad])]), 1, "calls[1].parents")


def test_unknown_parent(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [wf(calls=[call("0"), call("1", ["0", "9"])])])
    msg = load_error(path, 1, "calls[1].parents")
    assert "unknown parent id '9'" in msg and "'0'" in msg


def test_duplicate_parent(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [wf(calls=[call("0"), call("1", ["0", "0"])])])
    assert "listed twice" in load_error(path, 1, "calls[1].parents")


def test_parent_listed_after_child_says_topological(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [wf(calls=[call("a", ["b"]), call("b")])])
    msg = load_error(path, 1, "calls[0].parents")
    assert "parent 'b' is listed after this call" in msg and "topological" in msg
    assert "cycle" not in msg


def test_self_parent_is_a_cycle(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [wf(calls=[call("0"), call("a", ["0", "a"])])])
    assert "cycle: a -> a" in load_error(path, 1, "calls[1].parents")


def test_two_call_cycle(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [wf("w0"), wf("w1", [call("a", ["b"]), call("b", ["a"])])])
    msg = load_error(path, 2, "calls[0].parents")
    assert "cycle: a -> b -> a" in msg


def test_longer_cycle_reports_its_path(tmp_path: Path) -> None:
    calls = [call("s"), call("x", ["s", "z"]), call("y", ["x"]), call("z", ["y"])]
    msg = load_error(write_lines(tmp_path, [wf(calls=calls)]), 1, "calls[1].parents")
    assert "cycle: x -> y -> z -> x" in msg


@pytest.mark.parametrize("key", ["input_tokens", "output_tokens"])
@pytest.mark.parametrize("bad", [-3, 0, 3.0, 2.5, "5", True, None])
def test_token_counts_must_be_positive_ints(tmp_path: Path, key: str, bad: object) -> None:
    c = call("1", ["0"])
    c[key] = bad
    msg = load_error(write_lines(tmp_path, [wf(calls=[call("0"), c])]), 1, f"calls[1].{key}")
    assert "call '1'" in msg and "integer in [1, 10,000,000]" in msg


@pytest.mark.parametrize("key", ["input_tokens", "output_tokens", "tool_latency_s"])
def test_required_call_numbers(tmp_path: Path, key: str) -> None:
    c = call("0")
    del c[key]
    assert "missing" in load_error(write_lines(tmp_path, [wf(calls=[c])]), 1, f"calls[0].{key}")


@pytest.mark.parametrize("bad", ["-0.5", '"0.2"', "NaN", "Infinity", "-Infinity", "true", "null"])
def test_tool_latency_must_be_finite_nonnegative(tmp_path: Path, bad: str) -> None:
    line = ('{"workflow_id": "w", "calls": [{"id": "0", "parents": [], "input_tokens": 3, '
            f'"output_tokens": 4, "tool_latency_s": {bad}}}]}}')
    msg = load_error(write_lines(tmp_path, [line]), 1, "calls[0].tool_latency_s")
    assert "finite number of seconds >= 0" in msg


def test_tool_latency_accepts_ints() -> None:
    w = parse_workflow(wf(calls=[call("0", tool=2)]))
    assert w.calls[0].tool_latency_s == 2.0 and isinstance(w.calls[0].tool_latency_s, float)


@pytest.mark.parametrize("bad", ["-1", '"3"', "true", "NaN", "Infinity"])
def test_arrival_must_be_a_nonnegative_number_or_null(tmp_path: Path, bad: str) -> None:
    line = f'{{"workflow_id": "w", "arrival_s": {bad}, "calls": [{json.dumps(call("0"))}]}}'
    load_error(write_lines(tmp_path, [line]), 1, "arrival_s")


@pytest.mark.parametrize(("raw", "expected"), [("null", None), ("0", 0.0), ("1.5", 1.5)])
def test_valid_arrivals(tmp_path: Path, raw: str, expected: float | None) -> None:
    line = f'{{"workflow_id": "w", "arrival_s": {raw}, "calls": [{json.dumps(call("0"))}]}}'
    assert load_trace(write_lines(tmp_path, [line])).workflows[0].arrival_s == expected


def test_kind_must_be_a_string(tmp_path: Path) -> None:
    load_error(write_lines(tmp_path, [wf(calls=[call("0", kind=3)])]), 1, "calls[0].kind")


def test_parse_workflow_errors_use_the_given_label() -> None:
    with pytest.raises(TraceError) as info:
        parse_workflow(wf(calls=[call("0", n_out=0)]))
    assert str(info.value).startswith("<dict>: field 'calls[0].output_tokens'")
    with pytest.raises(TraceError) as info:
        parse_workflow(wf(calls=[call("0", n_out=0)]), source="my.jsonl", line=12)
    assert str(info.value).startswith("my.jsonl:12: field 'calls[0].output_tokens'")


# ---- KV demand -----------------------------------------------------------------------------------

def test_check_kv_demand(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [
        wf("small", [call("0", n_in=100, n_out=20)]),
        wf("big", [call("0", n_in=10, n_out=10), call("x", ["0"], n_in=900, n_out=101),
                   call("y", ["x"], n_in=2000, n_out=1)]),
    ], name="kv.jsonl")
    trace = load_trace(path)
    check_kv_demand(trace, 2001)  # exactly fits: no error
    with pytest.raises(TraceError) as info:
        check_kv_demand(trace, 1000)
    msg = str(info.value)
    assert msg.startswith(f"{trace.source}:2: field 'calls[1].input_tokens + output_tokens'")
    assert "workflow 'big'" in msg and "call 'x'" in msg and "900 + 101 = 1001" in msg
    assert "exceeds every decode instance's KV capacity of 1000 tokens" in msg
    assert "2 calls exceed it, the largest needs 2001" in msg
    # A plain list of workflows and an explicit source label also work.
    with pytest.raises(TraceError, match=r"^cfg\.yaml:2: .*call 'y'"):
        check_kv_demand(list(trace.workflows), 2000, source="cfg.yaml")
    with pytest.raises(ValueError, match="max_kv_tokens"):
        check_kv_demand(trace, 0)


def test_check_kv_demand_on_a_shipped_trace() -> None:
    bfcl = load_trace("bfcl_v3")
    check_kv_demand(bfcl, 49334 + 1219)  # README: max input 49,334 and max output 1,219
    with pytest.raises(TraceError, match="bfcl_v3.jsonl.gz:"):
        check_kv_demand(bfcl, 16_000)


# ---- property: random valid DAGs round-trip ----------------------------------------------------

@st.composite
def dag_objects(draw: st.DrawFn) -> dict:
    n = draw(st.integers(min_value=1, max_value=20))
    ids = draw(st.lists(st.text(min_size=1, max_size=6), min_size=n, max_size=n, unique=True))
    calls = []
    for i in range(n):
        parents = draw(st.lists(st.integers(0, i - 1), unique=True, max_size=4)) if i else []
        calls.append({
            "id": ids[i],
            "parents": [ids[p] for p in parents],
            "input_tokens": draw(st.integers(1, 200_000)),
            "output_tokens": draw(st.integers(1, 10_000)),
            "tool_latency_s": draw(st.floats(0, 1e4, allow_nan=False, allow_infinity=False)),
            "kind": draw(st.sampled_from(["", "chat", "expand", "value"])),
        })
    return {"workflow_id": draw(st.text(min_size=1, max_size=10)), "calls": calls}


@settings(max_examples=150, deadline=None)
@given(dag_objects())
def test_random_dags_round_trip(obj: dict) -> None:
    line = json.dumps(obj)
    w = parse_workflow(json.loads(line), source="prop.jsonl", line=3)
    assert w.workflow_id == obj["workflow_id"] and w.line == 3
    raw = obj["calls"]
    assert [c.id for c in w.calls] == [c["id"] for c in raw]
    index = {c["id"]: i for i, c in enumerate(raw)}
    for i, (c, r) in enumerate(zip(w.calls, raw, strict=True)):
        assert c.parents == tuple(sorted(index[p] for p in r["parents"]))
        assert all(p < i for p in c.parents)  # topological
        assert c.children == tuple(j for j, d in enumerate(w.calls) if i in d.parents)
        assert (c.input_tokens, c.output_tokens, c.tool_latency_s, c.kind) == (
            r["input_tokens"], r["output_tokens"], r["tool_latency_s"], r["kind"])


@settings(max_examples=30, deadline=None)
@given(st.lists(dag_objects(), min_size=1, max_size=5))
def test_random_dag_files_load(tmp_path_factory: pytest.TempPathFactory, objs: list[dict]) -> None:
    for k, obj in enumerate(objs):
        obj["workflow_id"] = f"w{k}"
        obj["source"] = "prop"
    path = tmp_path_factory.mktemp("prop") / "dags.jsonl.gz"
    path.write_bytes(gzip.compress("\n".join(json.dumps(o) for o in objs).encode()))
    trace = load_trace(path)
    assert isinstance(trace, Trace)
    assert [w.line for w in trace.workflows] == list(range(1, len(objs) + 1))
    assert trace.workflows == tuple(parse_workflow(o, line=k + 1, source="x")
                                    for k, o in enumerate(objs))
