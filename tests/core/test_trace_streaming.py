"""Lazy trace loading (workload.open_trace): an episode reads only what it needs, gives the same
episode as the eager loader, and the cluster's bounds are checked before block ids are built."""

from __future__ import annotations

import gzip
import json
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import hexagent_gym.workload.trace_formats as trace_formats
import hexagent_gym.workload.workflow_parser as workflow_parser
from hexagent_gym.episode import EpisodeConfig, EpisodeFactory, split_of, split_trace
from hexagent_gym.workload.arrivals import sample_episode
from hexagent_gym.workload.lazy_trace import LazyWorkflows
from hexagent_gym.workload.specs import TraceError
from hexagent_gym.workload.workload import load_trace, open_trace

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def big_trace(path: Path, n: int) -> Path:
    """``n`` two-call workflows in our schema (~290 bytes a line), written fast."""
    row = ('{{"workflow_id": "w{i}", "arrival_s": {t}, "calls": [{{"id": "0", "parents": [], '
           '"input_tokens": {a}, "output_tokens": 50, "tool_latency_s": 0.1}}, {{"id": "1", '
           '"parents": ["0"], "input_tokens": {b}, "output_tokens": 20, "tool_latency_s": 0.2, '
           '"prefix_of": "0", "prefix_tokens": {a}}}]}}\n')
    with open(path, "w") as f:
        f.writelines(row.format(i=i, t=i * 0.01, a=100 + i % 3000, b=700 + i % 3000)
                     for i in range(n))
    return path


def store_of(trace) -> object:
    return trace.workflows._store


# ---- streaming ----------------------------------------------------------------------------------

def test_ten_workflows_of_200k_lines_read_ten(tmp_path: Path) -> None:
    """Poisson sampling of 10 workflows from a 200k-line file parses 10 lines and holds only
    the line index: tracemalloc peak well under 50 MB (the eager loader peaks at ~350 MB)."""
    path = big_trace(tmp_path / "big.jsonl", 200_000)
    tracemalloc.start()
    try:
        trace = open_trace(path)
        work = sample_episode(trace, 10, np.random.default_rng(0), 1.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(trace) == 200_000 and len(work) == 10
    assert len(store_of(trace).parsed) == 10
    assert peak < 50 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    # the same workflows, in the same order, as from the eager loader's tuple
    perm = np.random.default_rng(0).permutation(200_000)[:10]
    assert [w.workflow_id for w in work.workflows] == [f"w{i}" for i in perm]


def test_mooncake_replay_reads_only_the_first_rows(tmp_path: Path) -> None:
    path = tmp_path / "moon.jsonl"
    with open(path, "w") as f:
        f.writelines(f'{{"timestamp": {i}, "input_length": 600, "output_length": 5, '
                     f'"hash_ids": [{i % 7}, 9]}}\n' for i in range(50_000))
    trace = open_trace(path)
    work = sample_episode(trace, 10, np.random.default_rng(0), None)
    assert [w.workflow_id for w in work.workflows] == [f"moon/{i}" for i in range(10)]
    index = store_of(trace).index
    assert len(store_of(trace).parsed) == 10 and len(index._offsets) < 50_000
    assert os.path.getsize(path) > index._next_offset  # the file was not read to its end


def _same(a, b) -> None:
    assert a.workflows == b.workflows
    assert np.array_equal(a.arrivals, b.arrivals)
    assert np.array_equal(a.trace_indices, b.trace_indices)


@pytest.mark.parametrize("name", ["mixed", "bfcl_v3", "agent_sessions"])
@pytest.mark.parametrize("split", ["all", "train", "eval"])
def test_lazy_episodes_equal_eager_ones(name: str, split: str) -> None:
    eager, lazy = split_trace(load_trace(name), split), split_trace(open_trace(name), split)
    assert isinstance(lazy.workflows, LazyWorkflows) and len(lazy) == len(eager)
    for seed in (0, 1, 7):
        for n in (1, 40, None, len(eager) + 5):
            _same(sample_episode(eager, n, np.random.default_rng(seed), 2.0),
                  sample_episode(lazy, n, np.random.default_rng(seed), 2.0))
    assert lazy.workflows == eager.workflows and lazy == eager


def test_lazy_replay_equals_eager_with_ties_and_disorder(tmp_path: Path) -> None:
    times = [3.0, 1.0, 1.0, 0.5, 2.0, 1.0, 0.0]
    lines = [json.dumps({"workflow_id": f"w{i}", "arrival_s": t, "calls": [
        {"id": "0", "parents": [], "input_tokens": 9 + i, "output_tokens": 2,
         "tool_latency_s": 0}]}) for i, t in enumerate(times)]
    path = tmp_path / "t.jsonl"
    path.write_text("\n\n".join(lines) + "\n")
    eager, lazy = load_trace(path), open_trace(path)
    for n in range(1, len(times) + 1):
        _same(sample_episode(eager, n, np.random.default_rng(0), None),
              sample_episode(lazy, n, np.random.default_rng(0), None))
    for split in ("train", "eval"):
        e, z = split_trace(eager, split), split_trace(lazy, split)
        _same(sample_episode(e, len(e), np.random.default_rng(0), None),
              sample_episode(z, len(z), np.random.default_rng(0), None))
    with pytest.raises(ValueError, match="has only 7 workflows to replay"):
        sample_episode(lazy, 8, np.random.default_rng(0), None)


def test_lazy_replay_without_arrival_times_names_the_workflow(tmp_path: Path) -> None:
    rows = [{"workflow_id": f"w{i}", "arrival_s": None if i == 2 else 1.0, "calls": [
        {"id": "0", "parents": [], "input_tokens": 9, "output_tokens": 2, "tool_latency_s": 0}]}
        for i in range(4)]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(ValueError, match="workflow 'w2' on line 3 has arrival_s = null"):
        sample_episode(open_trace(path), 2, np.random.default_rng(0), None)


@pytest.mark.parametrize("fixture", ["mooncake_small.jsonl", "bailian_small.jsonl"])
def test_public_formats_lazy_equal_eager(fixture: str) -> None:
    eager, lazy = load_trace(FIXTURES / fixture), open_trace(FIXTURES / fixture)
    assert lazy == eager
    for rate in (None, 3.0):
        _same(sample_episode(eager, None, np.random.default_rng(1), rate),
              sample_episode(lazy, None, np.random.default_rng(1), rate))


def test_gzip_blank_lines_and_bom(tmp_path: Path) -> None:
    text = "\ufeff" + "\n".join([json.dumps({"workflow_id": f"w{i}", "calls": [
        {"id": "0", "parents": [], "input_tokens": 5, "output_tokens": 1,
         "tool_latency_s": 0}]}) for i in range(3)]).replace("\n", "\n \r\n", 1)
    plain = tmp_path / "b.jsonl"
    plain.write_bytes(text.encode())  # no final newline
    packed = tmp_path / "b.jsonl.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    for path in (plain, packed):
        trace = open_trace(path)
        assert [w.line for w in trace.workflows] == [1, 3, 4]
        assert trace == load_trace(path)


def test_a_changed_file_is_an_error(tmp_path: Path) -> None:
    path = big_trace(tmp_path / "c.jsonl", 20)
    trace = open_trace(path)
    len(trace.workflows)
    big_trace(path, 21)
    with pytest.raises(TraceError, match="changed after it was indexed"):
        trace.workflows[5]


# ---- bounds -------------------------------------------------------------------------------------

def _no_blocks(*args, **kwargs):
    raise AssertionError("block ids built before the bounds were checked")


def test_bounds_are_checked_before_block_ids(tmp_path: Path, monkeypatch) -> None:
    ours = tmp_path / "o.jsonl"
    ours.write_text(json.dumps({"workflow_id": "w", "calls": [
        {"id": "c", "parents": [], "input_tokens": 60_000, "output_tokens": 10,
         "tool_latency_s": 0}]}) + "\n")
    moon = tmp_path / "m.jsonl"
    moon.write_text(json.dumps({"timestamp": 0, "input_length": 60_000, "output_length": 10,
                                "hash_ids": []}) + "\n")
    monkeypatch.setattr(workflow_parser, "derive_blocks", _no_blocks)
    monkeypatch.setattr(trace_formats, "_blocks", _no_blocks)
    for path, field in ((ours, r"calls\[0\]\.input_tokens \+ output_tokens"),
                        (moon, r"input_length \+ output_length")):
        for load in (load_trace, lambda p, **k: open_trace(p, **k).workflows[0]):
            with pytest.raises(TraceError, match=rf"{path}:1: field '{field}': .*60000 \+ 10 = "
                               r"60010 tokens, more than the model's context length \(40,960 "
                               r"tokens\); valid: input \+ output in \[2, 40,960\]"):
                load(path, max_context_tokens=40_960)


def test_cached_workflows_are_checked_against_tighter_bounds(tmp_path: Path) -> None:
    path = big_trace(tmp_path / "t.jsonl", 5)
    assert open_trace(path).workflows[3].calls[1].input_tokens == 703
    with pytest.raises(TraceError, match=r":4: field 'calls\[1\]\.input_tokens \+ "
                       r"output_tokens': call '1' .*KV capacity \(500 tokens\)"):
        open_trace(path, max_kv_tokens=500).workflows[3]


def test_episode_factory_rejects_a_call_no_decode_instance_holds(tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    rows = [{"workflow_id": f"w{i}", "calls": [
        {"id": "0", "parents": [], "input_tokens": 2000 if i != 3 else 9_000_000,
         "output_tokens": 10, "tool_latency_s": 0}]} for i in range(6)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(TraceError, match=rf"{path}:4: field 'calls\[0\]\.input_tokens \+ "
                       r"output_tokens'.*largest decode instance's KV capacity"):
        EpisodeFactory(EpisodeConfig(cluster="tiny-2p2d", trace=str(path), num_workflows=6,
                                     load=0.5))


def test_split_of_a_lazy_trace_parses_nothing() -> None:
    lazy = open_trace("sharegpt", block_tokens=256)
    half = split_trace(lazy, "eval")
    assert len(store_of(lazy).parsed) == 0
    assert {w.workflow_id for w in half.workflows} == {
        w.workflow_id for w in load_trace("sharegpt", 256).workflows
        if split_of(w.workflow_id) == "eval"}


def test_mooncake_time_order_is_checked_over_the_rows_read(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    stamps = [3052, 3052, 3053, 900, 4000]  # 3052 / 1000 * 1000 is not 3052 in float64
    path.write_text("".join(f'{{"timestamp": {t}, "input_length": 10, "output_length": 2, '
                            f'"hash_ids": []}}\n' for t in stamps))
    trace = open_trace(path)
    trace.workflows[1]  # parsed out of order first: no false "earlier" error later
    work = sample_episode(trace, 3, np.random.default_rng(0), None)
    assert work.arrivals.tolist() == [3.052, 3.052, 3.053]
    with pytest.raises(TraceError, match=r":4: field 'timestamp': 900.0 is earlier than the "
                       r"timestamp 3053.0 on line 3"):
        sample_episode(trace, 4, np.random.default_rng(0), None)
    with pytest.raises(TraceError, match=r":4: field 'timestamp'"):
        list(open_trace(path).workflows)
