"""Timelines (``record_timeline=True``): the spans reproduce every call's recorded times, lanes
behave as the instances do, and recording changes nothing (docs/timelines.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

import hexagent_gym
from hexagent_gym.config import ConfigError
from hexagent_gym.episode import EpisodeConfig, EpisodeFactory, load_config
from hexagent_gym.planning.decisions import Stage
from hexagent_gym.policy import make_policy, run_policy
from hexagent_gym.sim.horizon import _simulation
from hexagent_gym.sim.simulator import Simulator
from hexagent_gym.sim.timeline import CallInfo, Timeline, WorkflowInfo
from hexagent_gym.workload.workload import make_workflow
from tests.toy import FixedPredictor as Fixed
from tests.toy import ToyLatency, toy_cluster
from tests.toy import toy_episode as episode

LM = ToyLatency()
SMALL = dict(cluster="hetero-1", trace="bfcl_v3", num_workflows=20, load=1.0, seed=3)






def run(config: dict, policy: str = "hexagent", record: bool = True):
    sim = EpisodeFactory(EpisodeConfig(**config, record_timeline=record)).simulator()
    return sim, run_policy(sim, make_policy(policy))


def spans_by_call(timeline: Timeline) -> dict[tuple[int, int], list]:
    out = defaultdict(list)
    for s in timeline.spans:
        for c in (s.call, *s.riders):
            out[(s.workflow, c)].append(s)
    return out


def check_spans_match_calls(sim, timeline: Timeline) -> None:
    """Every call's spans tile its life and equal the times the engine kept on the call."""
    by_call = spans_by_call(timeline)
    for w in sim.workflows:
        for c in w.calls:
            spans = by_call[(w.uid, c.index)]
            kind = defaultdict(list)
            for s in spans:
                kind[s.kind].append(s)
                assert 0.0 <= s.start <= s.end
                assert (s.workflow_id, s.gpu) == (w.spec.workflow_id, (
                    sim.prefill if s.kind == "prefill" else sim.decode)[s.instance].gpu)
            (pre,) = kind["prefill"]
            xfer, dec, rec = kind["transfer"], kind["decode"], kind["recompute"]
            assert len(spans) >= 3
            assert (pre.start, pre.end, pre.instance) == (
                c.prefill_start, c.prefill_end, c.prefill_inst)
            assert pre.tokens == c.l_in or c.lead is not None
            assert pre.cached == (c.hit if c.lead is None else c.lead.hit)
            assert len(xfer) == 1 + c.moved and xfer[0].start == pre.end == c.prefill_end
            assert xfer[0].source == c.prefill_inst and xfer[-1].end <= dec[0].start
            if c.lead is None:  # a rider keeps its leader's first transfer_end
                assert (xfer[-1].end, xfer[-1].instance) == (c.transfer_end, c.decode_inst)
            assert len(dec) == 1 + c.preempted and len(rec) == c.preempted
            assert dec[0].start == c.decode_start and dec[-1].end == c.finish_t
            assert all(s.instance == c.decode_inst for s in dec + rec)
            assert abs(sum(s.tokens for s in dec) - c.l_out) <= c.preempted  # rounding only
            assert sum(s.duration for s in kind["wait"]) == pytest.approx(c.decode_wait,
                                                                         abs=1e-9)
            # the spans tile the call's life: each starts exactly where the previous ended
            ordered = sorted(spans, key=lambda s: s.start)
            assert [s.start for s in ordered[1:]] == [s.end for s in ordered[:-1]]


@pytest.fixture(scope="module")
def small():
    sim, result = run(SMALL)
    return sim, result, result.timeline


def test_spans_reproduce_every_calls_recorded_times(small):
    sim, result, tl = small
    assert len({(s.workflow, s.call) for s in tl.spans}) == result.num_calls == 87
    check_spans_match_calls(sim, tl)
    kinds = {s.kind for s in tl.spans}
    assert {"prefill", "transfer", "decode"} <= kinds <= set(hexagent_gym.sim.timeline.KINDS)
    assert tl.prefill == tuple(p.gpu for p in sim.prefill) and len(tl.decode) == 8
    assert tl.lane_name("prefill", 3) == "prefill 3 (h100)"
    assert [w.ratio for w in tl.workflows] == list(result.ratios)


def test_a_prefill_instance_runs_one_span_at_a_time(small):
    _, _, tl = small
    for p in range(len(tl.prefill)):
        lane = sorted((s for s in tl.spans if s.kind == "prefill" and s.instance == p),
                      key=lambda s: s.start)
        assert all(a.end <= b.start for a, b in zip(lane, lane[1:], strict=False))


def test_recording_changes_no_result(small):
    sim_on, on, _ = small
    sim_off, off = run(SMALL, record=False)
    assert off.timeline is None and sim_off._spans is None
    np.testing.assert_array_equal(on.ratios, off.ratios)

    def times(sim):
        return [(c.prefill_inst, c.decode_inst, c.prefill_start, c.decode_start, c.finish_t)
                for w in sim.workflows for c in w.calls]
    assert times(sim_on) == times(sim_off)
    assert (on.invocations, on.decisions, on.cached_tokens) == (
        off.invocations, off.decisions, off.cached_tokens)


def test_the_chrome_trace_round_trips_and_never_overlaps_on_a_track(small, tmp_path):
    _, _, tl = small
    path = tl.save_chrome_trace(tmp_path / "sub" / "trace.json")
    data = json.loads(path.read_text())
    assert data == json.loads(json.dumps(tl.to_chrome_trace()))
    events = data["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(tl.spans)
    names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "process_name"}
    assert (4, "prefill 3 (h100)") in names and len(names) == 16
    threads = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    tracks = defaultdict(list)
    for e, s in zip(complete, tl.spans, strict=True):
        assert e["cat"] == s.kind and e["args"]["call"] == s.call
        assert e["args"]["workflow_id"] == s.workflow_id
        assert e["ts"] == pytest.approx(s.start * 1e6) and e["dur"] >= 0
        assert (e["pid"], e["tid"]) in threads
        tracks[(e["pid"], e["tid"])].append(e)
    for evs in tracks.values():
        evs.sort(key=lambda e: e["ts"])
        # exactly, on the numbers as written (repr of the float); test_timeline_trace.py has more
        assert all(Decimal(repr(a["ts"])) + Decimal(repr(a["dur"])) <= Decimal(repr(b["ts"]))
                   for a, b in zip(evs, evs[1:], strict=False))


def test_the_gantt_is_a_png(small, tmp_path):
    _, _, tl = small
    out = tl.save_gantt(tmp_path / "g.png")
    head = out.read_bytes()[:8]
    assert head == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    first = tl.workflows[0]
    tl.save_gantt(tmp_path / "w.png", workflow=first.workflow_id, window=(0.0, 5.0))
    with pytest.raises(ValueError, match="end > start"):
        tl.save_gantt(tmp_path / "x.png", window=(3.0, 1.0))
    with pytest.raises(ValueError, match="no workflow with id 'nope'"):
        tl.save_gantt(tmp_path / "x.png", workflow="nope")
    with pytest.raises(ValueError, match="out of range"):
        tl.save_gantt(tmp_path / "x.png", workflow=99)


def test_default_workflow_is_the_worst_and_its_critical_path_ends_at_its_finish(small):
    _, result, tl = small
    w = tl.worst_workflow()
    assert tl.workflows[w].ratio == max(result.ratios)
    path = tl.critical_path(w)
    calls = tl.workflows[w].calls
    assert calls[path[-1]].finish == tl.workflows[w].finish and not calls[path[0]].parents
    assert all(a in calls[b].parents for a, b in zip(path, path[1:], strict=False))


def test_critical_path_follows_the_parent_that_finished_last():
    # diamond 0 -> {1, 2} -> 3 where 1 finishes after 2: the path is 0, 1, 3
    calls = (CallInfo(0, (), 0.0, 1.0, 0, 0), CallInfo(1, (0,), 1.0, 3.0, 0, 0),
             CallInfo(2, (0,), 1.0, 2.0, 0, 0), CallInfo(3, (1, 2), 3.0, 4.0, 0, 0))
    tl = Timeline([], ["g"], ["g"], [WorkflowInfo(0, "w", 0.0, 4.0, 2.0, 2.0, calls)])
    assert tl.critical_path(0) == [0, 1, 3] and tl.critical_path("w") == [0, 1, 3]


def test_a_preempted_call_has_one_span_per_interval_including_its_recompute():
    # two 100-token prompts generating 300 tokens each, predicted at 50, capacity 600: both
    # are admitted; b (admitted last) is preempted when each has generated 200, waits until a
    # finishes, recomputes its 300 tokens of KV and decodes its last 100
    a = make_workflow([(100, 300, 0.0, [])], "a")
    b = make_workflow([(100, 300, 0.0, [])], "b")
    sim = Simulator(toy_cluster(prefill=(LM, LM), capacity=600), episode(a, b),
                    length_predictor=Fixed(50), record_timeline=True)
    res = sim.run()
    assert res.preemptions == 1
    check_spans_match_calls(sim, res.timeline)
    ca, cb = sim.workflows[0].calls[0], sim.workflows[1].calls[0]
    spans = res.timeline.call_spans(1, 0)
    assert [s.kind for s in spans] == ["prefill", "transfer", "decode", "wait", "recompute",
                                       "decode"]
    _, _, first, wait, redo, last = spans
    assert (first.tokens, redo.tokens, last.tokens) == (200, 300, 100)
    assert wait.end == ca.finish_t  # admissions resume when a's memory frees
    assert redo.duration == pytest.approx(LM.prefill_time(300))
    assert last.end == cb.finish_t


def test_a_moved_call_has_two_transfers():
    a = make_workflow([(500, 400, 0.0, [])], "a")
    b = make_workflow([(400, 50, 0.0, [])], "b")

    def pick(dp):  # every prefill onto decode 0; decode picks at the smallest Δ
        slot = dp.remaining[0]
        call = dp.calls[slot]
        if dp.stage == Stage.PREFILL:
            return slot, call.index % 2, 0
        row = dp.delta_row(slot)
        p, d = divmod(int(np.argmin(row)), row.shape[1])
        return slot, p, d

    sim = Simulator(toy_cluster(prefill=(LM, LM), decode=(LM, LM), capacity=1000),
                    episode(a, b, arrivals=[0.0, 0.07]), record_timeline=True)
    res = sim.run(pick)
    assert res.decode_moves == 1
    check_spans_match_calls(sim, res.timeline)
    # the decode invocation at the instant its KV lands on 0 moves it: no wait in between
    spans = res.timeline.call_spans(1, 0)
    assert [(s.kind, s.instance) for s in spans] == [
        ("prefill", 0), ("transfer", 0), ("transfer", 1), ("decode", 1)]
    assert spans[2].start == spans[1].end and spans[2].source == 0


def test_sample_group_members_share_their_leaders_prefill_and_decode_apart():
    sim, res = run(dict(cluster="tiny-2p2d", trace="lats", num_workflows=4, load=1.0, seed=0))
    check_spans_match_calls(sim, res.timeline)
    grouped = [s for s in res.timeline.spans if s.riders]
    assert grouped and all(s.kind in ("prefill", "transfer", "wait") for s in grouped)
    s = grouped[0]
    for r in s.riders:  # each member decodes in its own span
        assert [x.kind for x in res.timeline.call_spans(s.workflow, r)].count("decode") == 1


def test_record_timeline_must_be_a_bool():
    with pytest.raises(ConfigError, match="record_timeline must be true or false, got 'yes'"):
        EpisodeConfig(record_timeline="yes")
    with pytest.raises(ConfigError, match="<dict>: .*record_timeline"):
        load_config({"record_timeline": 1})
    with pytest.raises(ValueError, match="record_timeline must be True or False"):
        Simulator(toy_cluster(), episode(make_workflow([(10, 5, 0.0, [])])),
                  record_timeline=None)


def test_standalone_horizons_never_record(small):
    sim, _, _ = small
    assert sim.horizons is not None and sim._spans is not None
    alone = _simulation(sim.cluster, sim.workload.workflows[0], sim.tables,
                        **sim.horizons.serving)
    assert alone._spans is None


def test_rollout_saves_the_timeline_json_and_png(tmp_path):
    env = hexagent_gym.make(cluster="tiny-2p2d", trace="bfcl_v3", num_workflows=8,
                            record_timeline=True)
    result = env.unwrapped.rollout("hexagent")
    assert result.timeline is result.episode.timeline and len(result.timeline) >= 3 * 8
    trace, png = result.save_timeline(tmp_path / "tl.json")
    assert (trace, png) == (tmp_path / "tl.json", tmp_path / "tl.png")
    assert json.loads(trace.read_text())["traceEvents"]
    assert png.read_bytes()[:4] == b"\x89PNG"
    off = hexagent_gym.make(cluster="tiny-2p2d", trace="bfcl_v3", num_workflows=8)
    res_off = off.unwrapped.rollout("hexagent")
    assert res_off.timeline is None
    np.testing.assert_array_equal(res_off.ratios, result.ratios)
    with pytest.raises(ValueError, match="record_timeline=True"):
        res_off.save_timeline(tmp_path / "off.json")


def test_real_episode_with_moves_after_a_wait():
    # the random policy moves free decode calls on this decode-bound episode, some after they
    # waited in their first instance's queue
    config = dict(cluster="hetero-1-lowmem", trace="agent_sessions", num_workflows=40,
                  load=1.0, seed=3)
    sim, res = run(config, policy="random")
    assert res.decode_moves > 0
    check_spans_match_calls(sim, res.timeline)
    moved = [[s.kind for s in res.timeline.call_spans(w.uid, c.index)]
             for w in sim.workflows for c in w.calls if c.moved]
    assert ["prefill", "transfer", "wait", "transfer", "decode"] in moved


def evaluate_cli(*args):
    root = Path(__file__).resolve().parents[2]
    return subprocess.run([sys.executable, str(root / "scripts/evaluate.py"), *args],
                          capture_output=True, text=True, cwd=root)


def test_evaluate_writes_one_cells_timeline(tmp_path):
    grid = ["--policies", "hexagent,fcfs", "--clusters", "tiny-2p2d", "--traces", "bfcl_v3",
            "--num-workflows", "6", "--seeds", "0"]
    out = evaluate_cli(*grid, "--timeline", str(tmp_path), "--timeline-policy", "fcfs",
                       "--timeline-workflow", "2")
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "fcfs-tiny-2p2d-bfcl_v3-seed0.json", "fcfs-tiny-2p2d-bfcl_v3-seed0.png"]
    assert "Gantt of workflow w2" in out.stderr
    trace = json.loads((tmp_path / "fcfs-tiny-2p2d-bfcl_v3-seed0.json").read_text())
    assert trace["otherData"]["policy"] == "fcfs" and not (tmp_path / "cells.jsonl").exists()
    bad = evaluate_cli(*grid, "--timeline", str(tmp_path), "--timeline-policy", "llf")
    assert bad.returncode == 2 and "no cell of" in bad.stderr and "fcfs, hexagent" in bad.stderr
    bad = evaluate_cli(*grid, "--timeline-policy", "fcfs")
    assert bad.returncode == 2 and "--timeline-policy needs --timeline DIR" in bad.stderr
