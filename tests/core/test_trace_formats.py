"""Public trace formats read by path (hexagent_gym.workload.trace_formats): Mooncake and
Qwen-Bailian."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from hexagent_gym.workload.arrivals import sample_episode
from hexagent_gym.workload.trace_formats import (
    BAILIAN_BLOCK_TOKENS,
    MOONCAKE_BLOCK_TOKENS,
    detect_format,
    ideal_prefix_hit_rate,
)
from hexagent_gym.workload.workload import TraceError, load_trace

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MOONCAKE = FIXTURES / "mooncake_small.jsonl"
BAILIAN = FIXTURES / "bailian_small.jsonl"


def raw_rows(path: Path) -> list[tuple[int, dict]]:
    """(1-based line, decoded row) of every non-blank line."""
    text = path.read_text(encoding="utf-8")
    return [(i, json.loads(s)) for i, s in enumerate(text.split("\n"), start=1) if s.strip()]


def write_lines(tmp_path: Path, lines: list[str | dict], name: str = "trace.jsonl") -> Path:
    """Write JSONL: dicts are dumped, strings are written verbatim (for broken lines)."""
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n"
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load_error(path: Path, line: int, field: str | None) -> str:
    """Load a broken file and check that the message names the file, line and field."""
    with pytest.raises(TraceError) as info:
        load_trace(path)
    msg = str(info.value)
    where = str(path.resolve())  # traces are reported by their resolved path
    assert path.name in msg
    assert f"{where}:{line}: " in msg
    if field is not None:
        assert f"field '{field}'" in msg
    return msg


# ---- format detection ------------------------------------------------------------------------

def test_detect_format() -> None:
    moon = {"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}
    bail = {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.0, "input_length": 10,
            "output_length": 2, "type": "text", "turn": 1, "hash_ids": [1]}
    ours = {"workflow_id": "w0", "source": "x", "arrival_s": 0.0,
            "calls": [{"id": "0", "parents": [], "input_tokens": 10, "output_tokens": 2,
                       "tool_latency_s": 0.0, "hash_ids": [1]}]}
    assert detect_format(json.dumps(moon), "f") == "mooncake"
    assert detect_format("\n  \n" + json.dumps(bail) + "\n", "f") == "bailian"
    assert detect_format(json.dumps(ours), "f") is None
    # our schema wins even when a row also carries the public keys
    assert detect_format(json.dumps({**moon, **ours}), "f") is None
    assert detect_format(json.dumps({**bail, "workflow_id": "w"}), "f") is None
    assert detect_format("", "f") is None
    assert detect_format("{not json", "f") is None
    assert detect_format(json.dumps({"timestamp": 0, "input_length": 3}), "f") is None


def test_own_schema_files_still_load(tmp_path: Path) -> None:
    row = {"workflow_id": "w0", "arrival_s": 1.0,
           "calls": [{"id": "0", "parents": [], "input_tokens": 10, "output_tokens": 2,
                      "tool_latency_s": 0.0}]}
    trace = load_trace(write_lines(tmp_path, [row]))
    assert [w.workflow_id for w in trace.workflows] == ["w0"]


# ---- Mooncake --------------------------------------------------------------------------------

def test_mooncake_fixture() -> None:
    trace = load_trace(MOONCAKE)
    rows = raw_rows(MOONCAKE)
    assert trace.name == "mooncake_small"
    assert len(trace) == len(rows) == 20  # one workflow per row, nothing dropped
    assert trace.num_calls == 20
    for index, (wf, (line, row)) in enumerate(zip(trace.workflows, rows, strict=True)):
        assert wf.workflow_id == f"mooncake_small/{index}"
        assert wf.source == "mooncake"
        assert wf.line == line == index + 1
        assert wf.arrival_s == row["timestamp"] / 1000
        assert wf.block_tokens == MOONCAKE_BLOCK_TOKENS == 512
        (call,) = wf.calls
        assert (call.id, call.parents, call.children, call.tool_latency_s, call.kind) == (
            "0", (), (), 0.0, "request")
        assert (call.input_tokens, call.output_tokens) == (row["input_length"],
                                                           row["output_length"])
        assert len(call.blocks) == math.ceil(row["input_length"] / 512)
        assert call.own_hit == 0  # a one-call workflow has no earlier call of its own
        assert (call.group, call.riders) == (-1, ())
    assert trace.workflows[0].arrival_s == 0.0
    assert trace.workflows[2].arrival_s == pytest.approx(0.512)


def test_mooncake_block_ids_follow_hash_ids() -> None:
    trace = load_trace(MOONCAKE)
    rows = [r for _, r in raw_rows(MOONCAKE)]
    calls = [wf.calls[0] for wf in trace.workflows]
    # equal hash ids -> equal block ids, different hash ids -> different block ids
    by_value: dict[int, set[int]] = {}
    for call, row in zip(calls, rows, strict=True):
        for value, block in zip(row["hash_ids"], call.blocks, strict=False):
            by_value.setdefault(value, set()).add(block)
    assert all(len(ids) == 1 for ids in by_value.values())
    remapped = [next(iter(ids)) for ids in by_value.values()]
    assert len(set(remapped)) == len(remapped)
    # the shared system prefix [0, 1, ...] of rows 0, 1, 3, 6, ... is one block pair
    assert calls[0].blocks[:2] == calls[1].blocks[:2] == calls[6].blocks == calls[19].blocks[:2]
    assert calls[0].blocks[:3] == calls[3].blocks[:3] == calls[11].blocks
    assert calls[2].blocks[0] == calls[5].blocks[0] and calls[2].blocks[1] != calls[5].blocks[1]
    # short hash_ids are padded with fresh ids that equal nothing else
    padded = [calls[10].blocks[1], *calls[18].blocks]  # rows with 1 of 2 and 0 of 2 ids
    assert len(calls[10].blocks) == 2 and len(calls[18].blocks) == 2
    everything = [b for c in calls for b in c.blocks]
    for b in padded:
        assert everything.count(b) == 1
        assert b not in remapped


def test_block_ids_differ_across_files(tmp_path: Path) -> None:
    copy = tmp_path / "mooncake_copy.jsonl"
    shutil.copyfile(MOONCAKE, copy)
    a, b = load_trace(MOONCAKE), load_trace(copy)
    assert [c.input_tokens for w in a.workflows for c in w.calls] == [
        c.input_tokens for w in b.workflows for c in w.calls]
    ids_a = {x for w in a.workflows for c in w.calls for x in c.blocks}
    ids_b = {x for w in b.workflows for c in w.calls for x in c.blocks}
    assert ids_a.isdisjoint(ids_b)
    # Bailian uses the same raw hash values (1, 2, 3, 10, ...) yet shares no block with Mooncake
    ids_c = {x for w in load_trace(BAILIAN).workflows for c in w.calls for x in c.blocks}
    assert ids_c.isdisjoint(ids_a) and ids_c.isdisjoint(ids_b)
    # and none with the blocks of our own schema's files
    shipped = {x for w in load_trace("lats").workflows[:20] for c in w.calls for x in c.blocks}
    assert shipped.isdisjoint(ids_a | ids_c)


def test_blank_lines_keep_line_numbers(tmp_path: Path) -> None:
    row = {"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [7]}
    path = write_lines(tmp_path, ["", json.dumps(row), "   ", json.dumps(row)])
    trace = load_trace(path)
    assert [w.line for w in trace.workflows] == [2, 4]
    assert [w.workflow_id for w in trace.workflows] == ["trace/0", "trace/1"]
    assert trace.workflows[0].calls[0].blocks == trace.workflows[1].calls[0].blocks


# ---- Qwen-Bailian ----------------------------------------------------------------------------

def test_bailian_fixture_chains() -> None:
    trace = load_trace(BAILIAN)
    rows = raw_rows(BAILIAN)
    assert trace.name == "bailian_small"
    assert [w.workflow_id for w in trace.workflows] == [
        "bailian_small/101", "bailian_small/102", "bailian_small/104", "bailian_small/107"]
    assert [len(w.calls) for w in trace.workflows] == [5, 4, 3, 3]
    assert trace.num_calls == len(rows) == 15  # every row is a call
    assert [w.line for w in trace.workflows] == [1, 2, 4, 7]  # the roots' lines
    assert [w.arrival_s for w in trace.workflows] == [0.0, 0.35, 3.0, 6.0]  # roots' timestamps
    assert {w.source for w in trace.workflows} == {"bailian"}
    assert {w.block_tokens for w in trace.workflows} == {BAILIAN_BLOCK_TOKENS} == {16}

    a, b, c, d = trace.workflows
    assert [x.id for x in a.calls] == ["101", "103", "106", "111", "115"]
    assert [x.parents for x in a.calls] == [(), (0,), (1,), (2,), (3,)]
    assert [x.children for x in a.calls] == [(1,), (2,), (3,), (4,), ()]
    assert [x.tool_latency_s for x in a.calls] == pytest.approx([0.0, 2.5, 3.5, 6.0, 3.5])
    # conversation B branches: 105 has two follow-ups (109 and 114)
    assert [x.id for x in b.calls] == ["102", "105", "109", "114"]
    assert [x.parents for x in b.calls] == [(), (0,), (1,), (1,)]
    assert b.calls[1].children == (2, 3)
    assert [x.tool_latency_s for x in b.calls] == pytest.approx([0.0, 3.9, 4.75, 9.75])
    assert [x.kind for x in c.calls] == ["image", "text", "image"]
    assert [x.kind for x in d.calls] == ["file", "file", "text"]
    assert [x.tool_latency_s for x in d.calls] == pytest.approx([0.0, 3.5, 2.5])

    by_id = {call.id: (wf, call) for wf in trace.workflows for call in wf.calls}
    for _, row in rows:
        _, call = by_id[str(row["chat_id"])]
        assert (call.input_tokens, call.output_tokens, call.kind) == (
            row["input_length"], row["output_length"], row["type"])
        assert len(call.blocks) == math.ceil(row["input_length"] / 16)
        assert call.tool_latency_s >= 0.0
        assert (call.group, call.riders) == (-1, ())


def test_bailian_own_hit_is_shared_leading_blocks() -> None:
    trace = load_trace(BAILIAN)
    raw = {r["chat_id"]: r for _, r in raw_rows(BAILIAN)}
    checked = 0
    for wf in trace.workflows:
        assert wf.calls[0].own_hit == 0
        for call in wf.calls[1:]:
            row = raw[int(call.id)]
            parent_row = raw[row["parent_chat_id"]]
            parent = wf.calls[call.parents[0]]
            k = 0
            for mine, theirs in zip(row["hash_ids"], parent_row["hash_ids"], strict=False):
                if mine != theirs:
                    break
                k += 1
            assert call.own_hit == min(k * 16, row["input_length"])
            assert call.blocks[:k] == parent.blocks[:k]
            checked += 1
    assert checked == 11
    own = {c.id: c.own_hit for w in trace.workflows for c in w.calls}
    assert own["103"] == 48  # 3 shared blocks x 16
    assert own["108"] == 29  # both blocks shared: 32 capped at input_length = 29
    assert own["112"] == 96  # the parent's 7th block was padded (fresh): 6 shared
    assert own["115"] == 208


def test_bailian_padding_and_cross_conversation_sharing() -> None:
    trace = load_trace(BAILIAN)
    calls = {c.id: c for w in trace.workflows for c in w.calls}
    # 110 gives 6 of ceil(100 / 16) = 7 ids: the 7th is fresh and matches nothing
    fresh = calls["110"].blocks[6]
    assert sum(b == fresh for c in calls.values() for b in c.blocks) == 1
    # conversations A and C start with the same hash id 1: the same block id
    assert calls["101"].blocks[0] == calls["104"].blocks[0]
    assert calls["101"].blocks[1] != calls["104"].blocks[1]


# ---- replay ----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [MOONCAKE, BAILIAN], ids=["mooncake", "bailian"])
def test_replay_keeps_file_order(path: Path) -> None:
    trace = load_trace(path)
    work = sample_episode(trace, None, np.random.default_rng(0), None)
    assert work.trace_indices.tolist() == list(range(len(trace)))  # ties keep file order
    assert work.workflows == trace.workflows
    assert work.arrivals.tolist() == [w.arrival_s for w in trace.workflows]
    again = sample_episode(trace, None, np.random.default_rng(123), None)
    assert again.trace_indices.tolist() == work.trace_indices.tolist()
    first = sample_episode(trace, 3, np.random.default_rng(0), None)
    assert first.trace_indices.tolist() == [0, 1, 2]


# ---- ideal prefix hit rate -------------------------------------------------------------------

def test_ideal_prefix_hit_rate_mooncake_by_hand(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]},
        {"timestamp": 10, "input_length": 1200, "output_length": 5, "hash_ids": [1, 2, 3]},
        {"timestamp": 20, "input_length": 300, "output_length": 5, "hash_ids": [1]},
    ]
    trace = load_trace(write_lines(tmp_path, rows))
    # row 0: nothing seen -> 0; row 1: [1, 2] seen -> 1024; row 2: [1] seen -> min(512, 300)
    expected = (0 + 1024 + 300) / (1000 + 1200 + 300)
    assert ideal_prefix_hit_rate(trace.workflows) == pytest.approx(expected)
    # the order comes from arrival_s, not from the order given
    assert ideal_prefix_hit_rate(reversed(trace.workflows)) == pytest.approx(expected)


def test_ideal_prefix_hit_rate_stops_at_first_unseen_block(tmp_path: Path) -> None:
    rows = [
        {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.0, "input_length": 40,
         "output_length": 5, "type": "text", "turn": 1, "hash_ids": [1, 2, 3]},
        {"chat_id": 2, "parent_chat_id": -1, "timestamp": 1.0, "input_length": 48,
         "output_length": 5, "type": "text", "turn": 1, "hash_ids": [1, 9, 3]},
        {"chat_id": 3, "parent_chat_id": 1, "timestamp": 2.0, "input_length": 60,
         "output_length": 5, "type": "text", "turn": 2, "hash_ids": [1, 2, 3, 4]},
    ]
    trace = load_trace(write_lines(tmp_path, rows))
    # workflow 1 (arrival 0): call 1 -> 0, then its child call 3 -> [1, 2, 3] seen: min(48, 60);
    # workflow 2 (arrival 1): call 2 -> [1] seen, 9 unseen (3 does not count after it) -> 16
    assert [len(w.calls) for w in trace.workflows] == [2, 1]
    expected = (0 + 48 + 16) / (40 + 60 + 48)
    assert ideal_prefix_hit_rate(trace.workflows) == pytest.approx(expected)
    assert ideal_prefix_hit_rate(()) == 0.0


def test_ideal_prefix_hit_rate_of_fixtures_is_a_rate() -> None:
    for path in (MOONCAKE, BAILIAN):
        rate = ideal_prefix_hit_rate(load_trace(path).workflows)
        assert 0.0 < rate < 1.0


# ---- malformed files -------------------------------------------------------------------------

def moon(ts: object = 0, n_in: object = 600, n_out: object = 10,
         hashes: object = (1, 2), **extra: object) -> dict:
    row = {"timestamp": ts, "input_length": n_in, "output_length": n_out,
           "hash_ids": list(hashes) if isinstance(hashes, tuple) else hashes}
    row.update(extra)
    return row


def bail(cid: object, parent: object = -1, ts: object = 0.0, n_in: object = 40,
         hashes: object = (1, 2, 3), **extra: object) -> dict:
    row = {"chat_id": cid, "parent_chat_id": parent, "timestamp": ts, "input_length": n_in,
           "output_length": 5, "type": "text", "turn": 1,
           "hash_ids": list(hashes) if isinstance(hashes, tuple) else hashes}
    row.update(extra)
    return row


def without(row: dict, key: str) -> dict:
    return {k: v for k, v in row.items() if k != key}


MALFORMED = {
    # name: (lines, bad line, field, extra text the message must contain)
    "moon-invalid-json": ([moon(), moon(), '{"timestamp": 5,'], 3, None, "invalid JSON"),
    "moon-not-object": ([moon(), "[1, 2]"], 2, None, "list"),
    "moon-missing-key": ([moon(), without(moon(), "output_length")], 2, "output_length",
                         "Mooncake"),
    "moon-missing-hash": ([moon(), without(moon(), "hash_ids")], 2, "hash_ids", "Mooncake"),
    "moon-input-zero": ([moon(), moon(n_in=0)], 2, "input_length", "integer in [1, "),
    "moon-input-float": ([moon(n_in=600.0)], 1, "input_length", "integer in [1, "),
    "moon-input-string": ([moon(n_in="600")], 1, "input_length", "integer in [1, "),
    "moon-output-zero": ([moon(), moon(), moon(n_out=0)], 3, "output_length", "integer in [1, "),
    "moon-output-bool": ([moon(n_out=True)], 1, "output_length", "integer in [1, "),
    "moon-negative-ts": ([moon(ts=-5)], 1, "timestamp", ">= 0"),
    "moon-nan-ts": ([moon(), "{\"timestamp\": NaN, \"input_length\": 5, "
                     "\"output_length\": 1, \"hash_ids\": []}"], 2, "timestamp", "finite"),
    "moon-string-ts": ([moon(ts="0")], 1, "timestamp", "number"),
    "moon-non-monotone": ([moon(ts=0), moon(ts=900), moon(ts=500)], 3, "timestamp",
                          "line 2"),
    "moon-hash-not-list": ([moon(hashes="1,2")], 1, "hash_ids", "list of integer"),
    "moon-hash-float": ([moon(), moon(hashes=[1, 2.0])], 2, "hash_ids", "list of integer"),
    "moon-hash-bool": ([moon(hashes=[True])], 1, "hash_ids", "list of integer"),
    "moon-hash-too-long": ([moon(), moon(n_in=600, hashes=[1, 2, 3])], 2, "hash_ids",
                           "at most ceil(input_length / 512) = 2"),
    "moon-foreign-row": ([moon(), moon(chat_id=3, parent_chat_id=-1)], 2, "chat_id",
                         "one format"),
    "bail-missing-chat-id": ([bail(1), without(bail(2), "chat_id")], 2, "chat_id",
                             "Qwen-Bailian"),
    "bail-unknown-parent": ([bail(1), bail(2, parent=7, ts=1.0)], 2, "parent_chat_id",
                            "earlier"),
    "bail-self-parent": ([bail(1), bail(2, parent=2, ts=1.0)], 2, "parent_chat_id", "earlier"),
    "bail-parent-later": ([bail(1), bail(2, parent=3), bail(3)], 2, "parent_chat_id",
                          "earlier"),
    "bail-parent-null": ([bail(1), bail(2, parent=None)], 2, "parent_chat_id", "-1"),
    "bail-duplicate-chat": ([bail(1), bail(2), bail(1, ts=2.0)], 3, "chat_id", "lines 1 and 3"),
    "bail-chat-string": ([bail("1")], 1, "chat_id", "integer"),
    "bail-non-monotone": ([bail(1, ts=3.0), bail(2, parent=1, ts=2.5)], 2, "timestamp",
                          "line 1"),
    "bail-negative-ts": ([bail(1, ts=-0.5)], 1, "timestamp", ">= 0"),
    "bail-hash-too-long": ([bail(1, n_in=40, hashes=(1, 2, 3, 4))], 1, "hash_ids",
                           "at most ceil(input_length / 16) = 3"),
    "bail-hash-not-list": ([bail(1, hashes=None)], 1, "hash_ids", "list of integer"),
    "bail-input-zero": ([bail(1), bail(2, parent=1, n_in=0)], 2, "input_length", "integer in [1, "),
    "bail-type-not-string": ([bail(1, type=3)], 1, "type", "string"),
    "bail-turn-not-int": ([bail(1, turn="1")], 1, "turn", "integer"),
    "bail-foreign-row": ([bail(1), bail(2, workflow_id="w")], 2, "workflow_id", "one format"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_rows(case: str, tmp_path: Path) -> None:
    lines, line, field, extra = MALFORMED[case]
    path = write_lines(tmp_path, lines, name=f"{case}.jsonl")
    msg = load_error(path, line, field)
    assert extra in msg


def test_non_monotone_message_names_both_lines(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [moon(ts=0), moon(ts=900), moon(ts=900), moon(ts=500)])
    msg = load_error(path, 4, "timestamp")
    assert "500" in msg and "900" in msg and "line 3" in msg and "non-decreasing" in msg


def test_equal_timestamps_are_allowed(tmp_path: Path) -> None:
    trace = load_trace(write_lines(tmp_path, [bail(1, ts=1.0), bail(2, parent=1, ts=1.0)]))
    assert trace.workflows[0].calls[1].tool_latency_s == 0.0


def test_bailian_without_type_or_turn(tmp_path: Path) -> None:
    row = without(without(bail(1), "type"), "turn")
    trace = load_trace(write_lines(tmp_path, [row]))
    assert trace.workflows[0].calls[0].kind == ""
