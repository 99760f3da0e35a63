"""Print the latency model's calibration table (and, with --timeit, its cost per call).

Usage:
    python scripts/calibrate_latency.py            # markdown table, as in docs/latency.md
    python scripts/calibrate_latency.py --timeit   # plus microseconds per hot-path call
"""

from __future__ import annotations

import argparse
import timeit

from hexagent_gym.cluster.calibration import CalibrationResult, calibration_table
from hexagent_gym.cluster.latency import LatencyModel


def _row(r: CalibrationResult) -> str:
    p = r.point
    setup = f"{p.model} {p.gpu.upper()} TP{p.tp} {p.weight_dtype.upper()}"
    if p.floor:
        verdict = f"{r.model_ms / p.measured_ms:.1f}x floor"
    elif p.tolerance is None:
        verdict = "reference"
    else:
        verdict = "ok" if abs(r.error) <= p.tolerance else "OUT"
        verdict += f" (±{p.tolerance:.0%})"
    note = f"; {p.note}" if p.note else ""
    error = "" if p.floor else f"{r.error:+.1%}"
    return (f"| {p.point} | {setup}; {p.conditions}{note} | {p.measured_ms:.2f} | "
            f"{r.model_ms:.2f} | {error} | {verdict} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeit", action="store_true", help="also time the hot-path methods")
    args = parser.parse_args()

    results = calibration_table()
    sections = (("Measurements", [r for r in results if not r.point.floor]),
                ("Roofline floors at 100 % of peak (the 'measured' column holds the floor)",
                 [r for r in results if r.point.floor]))
    for title, rows in sections:
        print(f"\n### {title}\n")
        print("| point | conditions | measured ms | model ms | error | verdict |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(_row(r))
    checked = [r for r in results if r.point.tolerance is not None and not r.point.floor]
    worst = max(checked, key=lambda r: abs(r.error))
    print(f"\n{sum(abs(r.error) <= r.point.tolerance for r in checked)}/{len(checked)} toleranced "
          f"points within tolerance; worst {worst.point.point} {worst.error:+.1%}")

    if args.timeit:
        print("\n### Cost per call (best of 5 x 200k calls)\n")
        for spec in (("llama-3.1-70b", "h100", 4), ("qwen3-235b-a22b", "h200", 4)):
            lm = LatencyModel(*spec)
            for stmt in ("lm.prefill_time(1500)", "lm.decode_step_time(37, 60000)"):
                n = 200_000
                best = min(timeit.repeat(stmt, globals={"lm": lm}, number=n, repeat=5))
                print(f"- {spec[0]} {spec[1]} TP{spec[2]}: `{stmt}` {best / n * 1e6:.2f} µs")


if __name__ == "__main__":
    main()
