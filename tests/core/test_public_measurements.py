"""configs/calibration/public_measurements.yaml and scripts/compare_public_latency.py: the shipped
file loads with every field and a traceable source, each operation is compared with the right term
of the latency model, and a bad entry fails with a message naming the entry and the field."""

from __future__ import annotations

import math
import re

import pytest
import yaml

from hexagent_gym.cluster.cluster import DEFAULT_NETWORK_EFFICIENCY, DEFAULT_SETUP_MS
from hexagent_gym.cluster.latency import LatencyModel
from hexagent_gym.config import ConfigError
from hexagent_gym.scripts import compare_public_latency as cpl

_SOURCE = re.compile(r"^(https?://\S+|[\w.-]+/[\w.-]+@[0-9a-f]{40}:\S+)$")


@pytest.fixture(scope="module")
def shipped():
    return cpl.load_points()


def _write(tmp_path, points):
    path = tmp_path / "points.yaml"
    path.write_text(yaml.safe_dump({"schema": 1, "points": points}, sort_keys=False))
    return path


def _point(**changes):
    base = {"id": "hand-1", "model": "llama-3.1-70b", "gpu": "h100", "tp": 4, "dtype": "bf16",
            "operation": "attention_decode", "batch": 8, "context_tokens": 2048,
            "measured_ms": 2.0, "source": "https://example.org/table", "note": "hand-made"}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def test_shipped_file_has_every_field_and_a_traceable_source(shipped):
    assert len(shipped) >= 100
    assert len({p.id for p in shipped}) == len(shipped)
    for p in shipped:
        assert _SOURCE.match(p.source), (p.id, p.source)
        assert p.note and p.row, p.id
        assert p.operation in cpl.OPERATIONS
        assert p.measured_ms > 0 and math.isfinite(p.measured_ms)
        assert p.batch >= 1 and p.tp in (1, 2, 4, 8)
        if cpl.OPERATIONS[p.operation][0] == "prefill":
            assert p.prompt_tokens >= 1, p.id
        if p.components:
            assert p.measured_ms == pytest.approx(
                p.repeat * sum(c.count * c.ms for c in p.components) / p.divide)
    # the paper's set-ups are covered
    groups = {(p.model, p.gpu, p.tp) for p in shipped if p.dtype == "bf16"}
    for group in (("llama-3.1-70b", "a100", 4), ("llama-3.1-70b", "h100", 4),
                  ("llama-3.1-70b", "h200", 4), ("qwen3-235b-a22b", "a100", 8),
                  ("qwen3-235b-a22b", "h100", 8), ("qwen3-235b-a22b", "h200", 4)):
        assert group in groups


def test_every_shipped_point_gets_our_figure(shipped):
    rows = cpl.compare(shipped)
    for r in rows:
        if r.point.operation == "elementwise_decode":
            assert r.ours_ms is None and r.ratio is None
        else:
            assert r.ours_ms > 0 and math.isfinite(r.ratio), r.point.id
    report = cpl.format_report(rows)
    assert "### Summary per group" in report and "### Summary per operation" in report


def test_derive_measured_ms_is_repeat_times_weighted_sum_over_divide():
    comps = (cpl.Component("qkv", 0.02), cpl.Component("gate_up half", 0.04, count=2))
    assert cpl.derive_measured_ms(comps, repeat=80) == pytest.approx(80 * 0.10)
    assert cpl.derive_measured_ms((cpl.Component("e2e", 2077.53),), divide=128) \
        == pytest.approx(16.2307, abs=1e-4)


def test_hand_made_points_use_the_matching_term(tmp_path):
    path = _write(tmp_path, [
        _point(id="att", operation="attention_decode", batch=8, context_tokens=2048),
        _point(id="step", operation="decode_step", batch=8, context_tokens=2048),
        _point(id="lin", operation="linear_decode", batch=1, context_tokens=0, measured_ms=None,
               components=[{"what": "one layer", "ms": 0.16}], repeat=80),
        _point(id="linpf", operation="linear_prefill", batch=1, context_tokens=None,
               prompt_tokens=2048),
        _point(id="ar", operation="allreduce", batch=256, context_tokens=0),
        _point(id="pf", operation="prefill", context_tokens=None, prompt_tokens=1024),
        _point(id="moe", model="qwen3-235b-a22b", tp=8, operation="moe_decode", batch=64,
               context_tokens=0),
        _point(id="kv", model="qwen3-235b-a22b", tp=8, operation="kv_transfer",
               context_tokens=None, prompt_tokens=4096, measured_ms=None, measured_gbs=100.0,
               kv_gb=0.5, link_gbs=200),
        _point(id="elt", operation="elementwise_decode", batch=1, context_tokens=0),
    ])
    points = {p.id: p for p in cpl.load_points(path)}
    ours = {r.point.id: r for r in cpl.compare(list(points.values()))}
    lm = LatencyModel("llama-3.1-70b", "h100", 4, min_kv_tokens=1)
    qwen = LatencyModel("qwen3-235b-a22b", "h100", 8, min_kv_tokens=1)

    assert ours["att"].ours_ms == pytest.approx(
        lm.decode_breakdown(8, 8 * 2048)["attention"] * 1e3)
    assert ours["step"].ours_ms == pytest.approx(lm.decode_step_time(8, 8 * 2048) * 1e3)
    assert ours["att"].ratio == pytest.approx(ours["att"].ours_ms / 2.0)
    # batch 1 is memory-bound: our decode 'linear' minus the LM head's weight read
    lin = lm.decode_breakdown(1, 0)["linear"] - lm.prefill_breakdown(1)["lm_head"]
    assert ours["lin"].ours_ms == pytest.approx(lin * 1e3, rel=1e-5)
    assert points["lin"].measured_ms == pytest.approx(12.8)
    assert ours["linpf"].ours_ms == pytest.approx(lm.prefill_breakdown(2048)["linear"] * 1e3)
    assert ours["ar"].ours_ms == pytest.approx(lm.decode_breakdown(256, 0)["allreduce"] * 1e3)
    assert ours["pf"].ours_ms == pytest.approx(lm.prefill_time(1024) * 1e3)
    moe_fixed = 94 * qwen.gpu.efficiency.moe_layer_overhead_us * 1e-3
    assert ours["moe"].ours_ms == pytest.approx(
        qwen.decode_breakdown(64, 0)["experts"] * 1e3 + moe_fixed)
    # the measured set-up's line rate at our network efficiency, our setup and logical KV bytes
    assert points["kv"].measured_ms == pytest.approx(5.0)
    expected = DEFAULT_SETUP_MS + qwen.kv_bytes(4096) / (DEFAULT_NETWORK_EFFICIENCY * 200e9) * 1e3
    assert ours["kv"].ours_ms == pytest.approx(expected)
    assert ours["elt"].ours_ms is None and not ours["elt"].within


@pytest.mark.parametrize(("change", "field"), [
    ({"source": None}, "source"),
    ({"source": "  "}, "source"),
    ({"operation": "decode"}, "operation"),
    ({"context_tokens": None}, "context_tokens"),
    ({"measured_ms": None}, "measured_ms"),
    ({"measured_ms": -1.0}, "measured_ms"),
    ({"components": [{"what": "x", "ms": 0.1}]}, "measured_ms"),
    ({"measured_ms": None, "components": [{"what": "x", "ms": -0.1}]}, "ms"),
    ({"measured_ms": None, "components": [{"ms": 0.1}]}, "components"),
    ({"repeat": 80}, "repeat"),
    ({"gpu": "h900"}, "gpu"),
    ({"model": "llama-9b"}, "model"),
    ({"tp": 3}, "tp"),
    ({"dtype": "fp16"}, "dtype"),
    ({"batch": 0}, "batch"),
    ({"link_gbs": 100}, "link_gbs"),
    ({"sourse": "x"}, "sourse"),
])
def test_bad_entry_names_the_entry_and_the_field(tmp_path, change, field):
    path = _write(tmp_path, [_point(id="good"), _point(id="broken", **change)])
    with pytest.raises(ConfigError) as info:
        cpl.load_points(path)
    message = str(info.value)
    assert "entry 1 'broken'" in message and f"'{field}'" in message, message
    assert str(path) in message


def test_unknown_field_suggests_the_right_one(tmp_path):
    path = _write(tmp_path, [_point(sourse="x")])
    with pytest.raises(ConfigError, match="Did you mean: `source`"):
        cpl.load_points(path)


def test_duplicate_id_is_rejected(tmp_path):
    path = _write(tmp_path, [_point(id="same"), _point(id="same")])
    with pytest.raises(ConfigError, match=r"entry 1 'same': field 'id' repeats entry 0"):
        cpl.load_points(path)


def test_summary_counts_the_band():
    point = cpl.PublicPoint(id="x", model="llama-3.1-70b", gpu="h100", tp=4, dtype="bf16",
                            operation="decode_step", batch=1, context_tokens=0, prompt_tokens=0,
                            measured_ms=10.0, source="https://example.org", note="n")
    rows = [cpl.Comparison(point, ms) for ms in (7.0, 8.0, 10.0, 12.5, 13.0)]
    median, within, n = cpl.summarize(rows + [cpl.Comparison(point, None)])
    assert (median, within, n) == (pytest.approx(1.0), 3, 5)
    assert "median ours/public 1.00; 3/5 within 0.8-1.25x" in cpl.format_report(rows)


def test_main_filters_and_prints(tmp_path, capsys):
    path = _write(tmp_path, [_point(id="a"), _point(id="b", gpu="a100")])
    assert cpl.main(["--file", str(path), "--gpu", "A100"]) == 0
    out = capsys.readouterr().out
    assert "| b | attention_decode |" in out and "| a |" not in out
    assert cpl.main(["--file", str(path), "--operation", "prefill"]) == 1
