"""The synthetic agent-session trace and the scenario cluster that loads decode KV."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from hexagent_gym.cluster.cluster import load_cluster
from hexagent_gym.config import ConfigError
from hexagent_gym.workload.synthetic import agent_sessions
from hexagent_gym.workload.workload import load_trace, parse_workflow


def test_sessions_are_valid_chains_that_resend_their_history():
    rows = agent_sessions(40, np.random.default_rng(3))
    for row in rows:
        spec = parse_workflow(row)  # schema-valid
        calls = row["calls"]
        assert 1 <= len(calls) <= 8
        for prev, call in zip(calls, calls[1:], strict=False):
            assert call["prefix_tokens"] == prev["input_tokens"] + prev["output_tokens"]
            assert call["input_tokens"] > call["prefix_tokens"]  # plus new content
            assert 0.5 <= call["tool_latency_s"] <= 2.0
        # the shared system prompt (2,048 tokens = 4 blocks of 512) is one set of ids for all
        assert spec.calls[0].blocks[:4] == parse_workflow(rows[0]).calls[0].blocks[:4]


def test_same_seed_same_sessions_and_the_shipped_trace_is_the_default_output():
    assert agent_sessions(5, np.random.default_rng(0)) == agent_sessions(
        5, np.random.default_rng(0))
    shipped = load_trace("agent_sessions")
    rows = agent_sessions(600, np.random.default_rng(0))
    assert [w.workflow_id for w in shipped.workflows] == [r["workflow_id"] for r in rows]
    assert [[c.input_tokens for c in w.calls] for w in shipped.workflows] == [
        [c["input_tokens"] for c in r["calls"]] for r in rows]


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="turns"):
        agent_sessions(3, np.random.default_rng(0), turns=(4, 2))


def test_max_model_len_lowers_the_kv_an_instance_must_hold():
    base = {"name": "x", "model": "llama-3.1-70b", "gpu_memory_utilization": 0.55,
            "prefill": [{"gpu": "h100", "tp": 4}], "decode": [{"gpu": "h100", "tp": 4}]}
    with pytest.raises(ConfigError, match="does not fit"):
        load_cluster(base)  # 55% cannot hold one 128k-token request
    c = load_cluster({**base, "max_model_len": 32768})
    assert 32768 <= c.decode[0].kv_capacity_tokens < load_cluster("hetero-1").decode[2] \
        .kv_capacity_tokens
    with pytest.raises(ConfigError, match="max_model_len"):
        load_cluster({**base, "max_model_len": 0})


def test_the_script_writes_byte_identical_files(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "make_agent_sessions.py"
    spec = importlib.util.spec_from_file_location("make_agent_sessions", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    a, b = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.gz"
    mod.main(["--n", "7", "--out", str(a)])
    mod.main(["--n", "7", "--out", str(b)])
    assert a.read_bytes() == b.read_bytes()
    assert len(gzip.decompress(a.read_bytes()).decode().splitlines()) == 7
    assert json.loads(gzip.decompress(a.read_bytes()).decode().splitlines()[0])["source"] == \
        "synthetic"


@pytest.mark.parametrize("key,value,message", [
    ("prefix_cache_tokens", -1, "prefix_cache_tokens must be a number of tokens >= 0"),
    ("prefix_block_tokens", 0, "prefix_block_tokens must be an integer >= 1"),
    ("prefix_cache", "yes", "prefix_cache must be true or false"),
    ("length_predictor", "lognormel", "Did you mean: `lognormal`"),
    ("length_predictor_params", {"sigmaa": 1.0}, "sigmaa"),
    ("decode_admission", "exact", "decode_admission must be one of predicted, true-demand"),
    ("free_decode_calls", 1, "free_decode_calls must be true or false"),
])
def test_serving_keys_are_validated_with_clear_errors(key, value, message):
    from hexagent_gym.episode import EpisodeConfig

    with pytest.raises(ConfigError, match=message):
        EpisodeConfig(**{key: value})
