"""A corpus of bad trace files: each is one TraceError naming the file and the line (or field),
raised before anything is allocated from the bad value (no hang, no MemoryError, no TypeError
or RecursionError from deep inside the loader), within 5 s and 500 MB (tracemalloc peak), by
the eager loader and by the lazy one when it reads the bad line."""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest

from hexagent_gym.workload.specs import MAX_LINE_BYTES, MAX_TOKENS, TraceError
from hexagent_gym.workload.workload import load_trace, open_trace


def call(**extra):
    return {"id": "0", "parents": [], "input_tokens": 10, "output_tokens": 5,
            "tool_latency_s": 0.0, **extra}


def ours(**calls_extra):
    return json.dumps({"workflow_id": "w", "calls": [call(**calls_extra)]})


def wf(calls, **extra):
    return json.dumps({"workflow_id": "w2", "calls": calls, **extra})


def moon(**extra):
    return json.dumps({"timestamp": 1, "input_length": 10, "output_length": 5, "hash_ids": [1],
                       **extra})


def bail(**extra):
    return json.dumps({"chat_id": 2, "parent_chat_id": -1, "timestamp": 1.0, "input_length": 10,
                       "output_length": 5, "type": "text", "turn": 1, "hash_ids": [1], **extra})


GOOD_OURS = ours().encode() + b"\n"
GOOD_MOON = json.dumps({"timestamp": 0, "input_length": 10, "output_length": 5,
                        "hash_ids": [1]}).encode() + b"\n"
GOOD_BAIL = json.dumps({"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.0, "input_length": 10,
                        "output_length": 5, "type": "text", "turn": 1,
                        "hash_ids": [1]}).encode() + b"\n"
CALL_FIELD = r"field 'calls\[0\]\.input_tokens'"
PAD = "x" * (10 * 2**20)  # a 10 MB string: the line is over MAX_LINE_BYTES

# case -> (file bytes after a good first line (None: the whole file), loader kwargs, message)
CASES: dict[str, tuple[bytes, bytes | None, dict, str]] = {
    # -- numbers
    "input_tokens 1e12": (GOOD_OURS, ours(input_tokens=10**12).encode(), {}, ":2: " + CALL_FIELD),
    "input_tokens 1e30": (GOOD_OURS, ours(input_tokens=10**30).encode(), {}, ":2: " + CALL_FIELD),
    "output_tokens above the bound": (GOOD_OURS, ours(output_tokens=MAX_TOKENS + 1).encode(), {},
                                      r":2: field 'calls\[0\]\.output_tokens'"),
    "negative input_tokens": (GOOD_OURS, ours(input_tokens=-5).encode(), {}, ":2: " + CALL_FIELD),
    "NaN input_tokens": (GOOD_OURS, ours().replace('"input_tokens": 10',
                                                   '"input_tokens": NaN').encode(), {},
                         ":2: " + CALL_FIELD),
    "bool input_tokens": (GOOD_OURS, ours(input_tokens=True).encode(), {}, ":2: " + CALL_FIELD),
    "float input_tokens": (GOOD_OURS, ours(input_tokens=3.0).encode(), {}, ":2: " + CALL_FIELD),
    "tool latency NaN": (GOOD_OURS, ours(tool_latency_s=float("nan")).encode(), {},
                         r":2: field 'calls\[0\]\.tool_latency_s'"),
    "tool latency 1e300": (GOOD_OURS, ours(tool_latency_s=1e300).encode(), {},
                           r":2: field 'calls\[0\]\.tool_latency_s'.*at most 1e\+09"),
    "arrival 1e300": (GOOD_OURS, json.dumps({"workflow_id": "w2", "arrival_s": 1e300,
                                             "calls": [call()]}).encode(), {},
                      r":2: field 'arrival_s'"),
    "shared prefix tokens 1e12": (GOOD_OURS, ours(shared_prefix_key="k",
                                                  shared_prefix_tokens=10**12).encode(), {},
                                  r":2: field 'calls\[0\]\.shared_prefix_tokens'"),
    "sample_group a list": (GOOD_OURS, ours(sample_group=[1]).encode(), {},
                            r":2: field 'calls\[0\]\.sample_group'"),
    "sample_group a bool": (GOOD_OURS, ours(sample_group=True).encode(), {},
                            r":2: field 'calls\[0\]\.sample_group'"),
    # -- what the cluster can hold, checked before block ids are built
    "over the model's context": (GOOD_OURS, ours(input_tokens=900, output_tokens=200).encode(),
                                 {"max_context_tokens": 1000},
                                 r":2: field 'calls\[0\]\.input_tokens \+ output_tokens': call "
                                 r"'0' needs 900 \+ 200 = 1100 tokens, more than the model's "
                                 r"context length \(1,000 tokens\); valid: .*\[2, 1,000\]"),
    "over the decode KV capacity": (GOOD_OURS, ours(input_tokens=9_000_000).encode(),
                                    {"max_kv_tokens": 1_000_000},
                                    r":2: field 'calls\[0\]\.input_tokens \+ output_tokens'.*KV "
                                    r"capacity \(1,000,000 tokens\)"),
    "too many prompt blocks": (GOOD_OURS, wf([call(id=str(i), input_tokens=MAX_TOKENS)
                                              for i in range(2)]).encode(),
                               {"block_tokens": 1}, r":2: field 'calls': .*prompt blocks"),
    # -- lines
    "truncated last line": (GOOD_OURS, b'{"workflow_id": "w2", "calls": [{"id"', {},
                            r":2: invalid JSON"),
    "non-UTF-8 byte": (GOOD_OURS, b'{"workflow_id": "w\xff", "calls": []}', {},
                       r":2: not UTF-8"),
    "empty file": (b"", None, {}, r"the trace file is empty"),
    "blank lines only": (b"\n  \n\t\n", None, {}, r"the trace file is empty"),
    "a JSON array": (GOOD_OURS, b"[1, 2]", {}, r":2: expected a JSON object"),
    "a number": (GOOD_OURS, b"42", {}, r":2: expected a JSON object.*got int"),
    "missing calls": (GOOD_OURS, b'{"workflow_id": "w2"}', {}, r":2: field 'calls': missing"),
    "missing input_tokens": (GOOD_OURS, json.dumps(
        {"workflow_id": "w2", "calls": [{k: v for k, v in call().items()
                                         if k != "input_tokens"}]}).encode(), {},
        ":2: " + CALL_FIELD + ": call '0': missing"),
    "deeply nested JSON": (GOOD_OURS, ('{"workflow_id": "w", "meta": ' + "[" * 100_000
                                       + "]" * 100_000 + ', "calls": []}').encode(), {},
                           r":2: JSON nested too deeply"),
    "a 10 MB line": (GOOD_OURS, json.dumps({"workflow_id": "w2", "meta": {"pad": PAD},
                                            "calls": [call()]}).encode(), {},
                     rf":2: line longer than the {MAX_LINE_BYTES:,} bytes"),
    # -- the DAG
    "cyclic parents": (GOOD_OURS, wf([call(id="a", parents=["b"]),
                                      call(id="b", parents=["a"])]).encode(), {},
                       r":2: field 'calls\[0\]\.parents'.*cycle: a -> b -> a"),
    "self parent": (GOOD_OURS, wf([call(id="a", parents=["a"])]).encode(), {},
                    r":2: field 'calls\[0\]\.parents'.*cycle: a -> a"),
    "parent out of range": (GOOD_OURS, wf([call(id="0"), call(id="1", parents=["7"])]).encode(),
                            {}, r":2: field 'calls\[1\]\.parents'.*unknown parent id '7'"),
    # -- public formats
    "Mooncake input_length 1e12": (GOOD_MOON, moon(input_length=10**12).encode(), {},
                                   r":2: field 'input_length'.*integer in \[1, "),
    "Mooncake timestamp Infinity": (GOOD_MOON, moon().replace('"timestamp": 1',
                                                              '"timestamp": Infinity').encode(),
                                    {}, r":2: field 'timestamp'"),
    "Mooncake timestamp 1e300": (GOOD_MOON, moon(timestamp=1e300).encode(), {},
                                 r":2: field 'timestamp'"),
    "Mooncake over the KV capacity": (GOOD_MOON, moon(input_length=5_000_000).encode(),
                                      {"max_kv_tokens": 100_000},
                                      r":2: field 'input_length \+ output_length'.*\[2, 100,000\]"),
    "Mooncake a list row": (GOOD_MOON, b"[1]", {}, r":2: expected a JSON object"),
    "Bailian input_length 1e12": (GOOD_BAIL, bail(input_length=10**12).encode(), {},
                                  r":2: field 'input_length'.*integer in \[1, "),
    "Bailian output_length NaN": (GOOD_BAIL, bail().replace('"output_length": 5',
                                                            '"output_length": NaN').encode(), {},
                                  r":2: field 'output_length'"),
    "Bailian over the context": (GOOD_BAIL, bail(input_length=50_000).encode(),
                                 {"max_context_tokens": 40_960},
                                 r":2: field 'input_length \+ output_length'.*context length"),
    "Bailian self parent": (GOOD_BAIL, bail(parent_chat_id=2).encode(), {},
                            r":2: field 'parent_chat_id'"),
}


def _file(tmp_path, case: str):
    first, rest, kwargs, message = CASES[case]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(first if rest is None else first + rest + b"\n")
    return path, kwargs, message


@pytest.mark.parametrize("lazy", [False, True], ids=["load_trace", "open_trace"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_one_clear_error(case, lazy, tmp_path):
    path, kwargs, message = _file(tmp_path, case)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(TraceError, match=message) as info:
            if lazy:  # reading every workflow reads the bad line
                list(open_trace(path, **kwargs).workflows)
            else:
                load_trace(path, **kwargs)
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(path) in str(info.value)
    assert elapsed < 5.0, f"{case}: {elapsed:.1f} s"
    assert peak < 500 * 2**20, f"{case}: peak {peak / 2**20:.0f} MiB"


@pytest.mark.parametrize("value", [10**12, 10**30, 0, True, 3.0])
def test_mooncake_token_counts(value, tmp_path):
    rows = [{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]},
            {"timestamp": 1, "input_length": value, "output_length": 5, "hash_ids": [1]}]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(TraceError, match=r":2: field 'input_length'.*integer in \[1, "):
        load_trace(path)
