"""scripts/cache_capacity.py --quick: the table has one row per trace x capacity, hit rates are
fractions, an empty cache serves only sample-group riders and an unbounded one never does worse."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cache_capacity.py"
TRACES = ("sharegpt", "bfcl_v3", "lats")
POLICIES = ("hexagent", "fcfs")


def _script():
    spec = importlib.util.spec_from_file_location("cache_capacity_script", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their module while the class is built
    spec.loader.exec_module(mod)
    return mod


def _table(text: str) -> dict[tuple[str, str], dict[str, float]]:
    lines = [x for x in text.splitlines() if x.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0], cells[1]] = {h: float(v) for h, v in zip(head[2:], cells[2:], strict=True)}
    return rows


def test_quick_table(tmp_path, capsys):
    out = tmp_path / "table.md"
    png = tmp_path / "plot.png"
    code = _script().main(["--quick", "--traces", ",".join(TRACES), "--policies",
                           ",".join(POLICIES), "--workers", "1", "--no-progress",
                           "--out", str(out), "--plot", str(png)])
    assert code == 0
    printed = capsys.readouterr().out
    rows = _table(printed)
    assert set(rows) == {(t, c) for t in TRACES for c in ("0", "inf")}
    assert _table(out.read_text()) == rows
    assert png.stat().st_size > 10_000
    for (trace, cap), row in rows.items():
        for key, value in row.items():
            if not key.startswith("Req99"):
                assert 0.0 <= value <= 1.0, (trace, cap, key, value)
            else:
                assert 0.0 < value < 100.0, (trace, cap, key, value)
    for trace in TRACES:
        empty, unbounded = rows[trace, "0"], rows[trace, "inf"]
        for p in POLICIES:
            # an empty cache serves nothing but the riders of sample groups (LATS)
            assert empty[f"hit {p}"] == empty["riders"]
            assert unbounded[f"hit {p}"] >= empty[f"hit {p}"]
            assert unbounded[f"hit {p}"] <= 1.0
        assert empty["ideal"] >= empty["own"] >= empty["riders"]  # more reuse visible to each
        if trace != "lats":
            assert empty["riders"] == 0.0
            assert empty["hit hexagent"] == empty["hit fcfs"] == 0.0
    assert rows["bfcl_v3", "inf"]["hit hexagent"] > 0.3  # BFCL's shared function docs
