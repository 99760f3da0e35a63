"""A corpus of bad trace rows: each is one TraceError naming the file, the line and the field,
raised before anything is allocated from the bad value (no hang, no MemoryError, no
TypeError or RecursionError from deep inside the loader)."""

from __future__ import annotations

import json

import pytest

from hexagent_gym.specs import MAX_TOKENS, TraceError
from hexagent_gym.workload import load_trace


def call(**extra):
    return {"id": "0", "parents": [], "input_tokens": 10, "output_tokens": 5,
            "tool_latency_s": 0.0, **extra}


def ours(**calls_extra):
    return json.dumps({"workflow_id": "w", "calls": [call(**calls_extra)]})


CASES = {
    "input_tokens 1e12": (ours(input_tokens=10**12), r":2: field 'calls\[0\]\.input_tokens'"),
    "input_tokens 1e30": (ours(input_tokens=10**30), r":2: field 'calls\[0\]\.input_tokens'"),
    "output_tokens above the bound": (ours(output_tokens=MAX_TOKENS + 1),
                                      r":2: field 'calls\[0\]\.output_tokens'"),
    "sample_group a list": (ours(sample_group=[1]), r":2: field 'calls\[0\]\.sample_group'"),
    "sample_group a bool": (ours(sample_group=True), r":2: field 'calls\[0\]\.sample_group'"),
    "tool latency NaN": (ours(tool_latency_s=float("nan")),
                         r":2: field 'calls\[0\]\.tool_latency_s'"),
    "deeply nested JSON": ('{"workflow_id": "w", "meta": ' + "[" * 100_000 + "]" * 100_000
                           + ', "calls": []}', r":2: JSON nested too deeply"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_our_schema(case, tmp_path):
    row, message = CASES[case]
    path = tmp_path / "bad.jsonl"
    path.write_text(ours() + "\n" + row + "\n")
    with pytest.raises(TraceError, match=message) as info:
        load_trace(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("value", [10**12, 10**30, 0, True, 3.0])
def test_mooncake_token_counts(value, tmp_path):
    rows = [{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]},
            {"timestamp": 1, "input_length": value, "output_length": 5, "hash_ids": [1]}]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(TraceError, match=r":2: field 'input_length'.*integer in \[1, "):
        load_trace(path)
