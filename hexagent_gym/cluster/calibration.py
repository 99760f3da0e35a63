"""Calibration of the latency model against published measurements.

The points below are inputs: published figures (the public source of each group is named in a
comment, and docs/latency.md#sources lists them), rules of thumb, and roofline floors computed
from the specs.

``calibration_table()`` evaluates every point with
:class:`~hexagent_gym.cluster.latency.LatencyModel`; ``scripts/calibrate_latency.py`` prints it and
docs/latency.md quotes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hexagent_gym.cluster.latency import LatencyModel


@dataclass(frozen=True, slots=True)
class CalibrationPoint:
    """One published measurement and the instance / step that reproduces it."""

    point: str
    """Label, e.g. ``S1-1k``; the prefix names the source (R rule of thumb, V1 vLLM nightly
    benchmark, Vidur kernel profiles, A aiconfigurator, N NVIDIA NIM, S Splitwise, Q Qwen3 FP8
    serving, F roofline floor)."""
    conditions: str
    model: str
    gpu: str
    tp: int
    weight_dtype: str
    phase: str
    """``prefill`` (args: tokens), ``decode`` (args: batch, context), or ``linear-layer`` (args:
    tokens; one layer's linear GEMMs, from the prefill breakdown)."""
    args: tuple[int, ...]
    measured_ms: float
    tolerance: float | None
    """Relative error the model must meet (tests check it); None = reference only."""
    note: str = ""
    floor: bool = False
    """``measured_ms`` is a roofline floor at 100 % of peak, not a measurement: the model must
    exceed it."""


# Contexts for the serving rows: ISL + OSL/2 is the average context over a request's decode.
_TOLERANCE = 0.25  # relative, for the modern-stack points (docs/latency.md, "Calibration")
CALIBRATION_POINTS: tuple[CalibrationPoint, ...] = (
    # Modern-stack rules of thumb (BF16 Llama-70B TPOT at batch <= 8: weight read at 80 % of HBM
    # bandwidth plus 3-6 ms fixed cost; prefill per 1k tokens). V1: vLLM's nightly benchmark
    # (Buildkite vllm/performance-benchmark, build 9515).
    CalibrationPoint("R-A100", "TPOT rule of thumb, batch 4 x 2k ctx", "llama-3.1-70b", "a100", 4,
                     "bf16", "decode", (4, 8192), 26.0, _TOLERANCE),
    CalibrationPoint("R-H100", "TPOT rule of thumb (16-18), batch 4 x 2k ctx", "llama-3.1-70b",
                     "h100", 4, "bf16", "decode", (4, 8192), 17.0, _TOLERANCE),
    CalibrationPoint("R-H200", "TPOT rule of thumb (12-15), batch 4 x 2k ctx", "llama-3.1-70b",
                     "h200", 4, "bf16", "decode", (4, 8192), 13.5, _TOLERANCE),
    CalibrationPoint("R-H100-pf", "prefill 1k tokens, rule of thumb (60-110)", "llama-3.1-70b",
                     "h100", 4, "bf16", "prefill", (1024,), 85.0, _TOLERANCE),
    CalibrationPoint("V1", "vLLM nightly, batch 8, in 32 / out 128", "llama-3.1-70b", "h200", 4,
                     "bf16", "decode", (8, 8 * 96), 16.2, _TOLERANCE, "older vLLM"),
    # Vidur per-layer linear GEMM times (microsoft/vidur, data/profiling/compute; they calibrate
    # MFU / MBU separately from overheads).
    *(CalibrationPoint(f"Vidur-A100-{n}", f"one layer's linear GEMMs, {n} tokens",
                       "llama-3.1-70b", "a100", 4, "bf16", "linear-layer", (n,), ms, _TOLERANCE)
      for n, ms in ((1, 0.285), (512, 1.05), (2048, 3.90), (8192, 14.75))),
    *(CalibrationPoint(f"Vidur-H100-{n}", f"one layer's linear GEMMs, {n} tokens",
                       "llama-3.1-70b", "h100", 4, "bf16", "linear-layer", (n,), ms, _TOLERANCE)
      for n, ms in ((1, 0.159), (512, 0.330), (2048, 1.22), (4096, 2.37))),
    # Modern FP8 serving, Llama-3.x-70B: ai-dynamo/aiconfigurator systems/silicon_sample.csv
    # (vLLM) and NVIDIA NIM 1.8.0's published benchmarks.
    CalibrationPoint("A1-c4", "vLLM FP8 TPOT, conc 4, ISL 1k / OSL 8k", "llama-3.1-70b", "h100",
                     4, "fp8", "decode", (4, 4 * 5120), 12.0, _TOLERANCE),
    CalibrationPoint("A1-c64", "vLLM FP8 TPOT, conc 64, ISL 1k / OSL 8k", "llama-3.1-70b",
                     "h100", 4, "fp8", "decode", (64, 64 * 5120), 23.4, _TOLERANCE,
                     "aggregated serving: includes prefill interference"),
    CalibrationPoint("A2-c4", "vLLM FP8 TPOT, conc 4, ISL 1k / OSL 8k", "llama-3.1-70b", "h200",
                     4, "fp8", "decode", (4, 4 * 5120), 9.96, _TOLERANCE),
    CalibrationPoint("A2-c64", "vLLM FP8 TPOT, conc 64, ISL 1k / OSL 8k", "llama-3.1-70b",
                     "h200", 4, "fp8", "decode", (64, 64 * 5120), 18.5, _TOLERANCE,
                     "aggregated serving: includes prefill interference"),
    CalibrationPoint("N1-ttft-5k", "NIM FP8 TTFT, ISL 5000, conc 1", "llama-3.1-70b", "h100", 2,
                     "fp8", "prefill", (5000,), 407.0, _TOLERANCE),
    CalibrationPoint("N1-ttft-500", "NIM FP8 TTFT, ISL 500, conc 1", "llama-3.1-70b", "h100", 2,
                     "fp8", "prefill", (500,), 47.8, _TOLERANCE),
    CalibrationPoint("N1-itl", "NIM FP8 ITL, ISL 5000 / OSL 500, conc 1", "llama-3.1-70b",
                     "h100", 2, "fp8", "decode", (1, 5250), 18.6, _TOLERANCE),
    # 2023 vLLM (Mutinifni/splitwise-sim data/perf_model.csv, Llama-2-70B FP16): reference only,
    # the model should be faster.
    *(CalibrationPoint(f"S1-{n // 1024}k", f"2023 vLLM prefill {n} tokens", "llama-3.1-70b",
                       "h100", 4, "bf16", "prefill", (n,), ms, None, "2023 vLLM")
      for n, ms in ((1024, 105.6), (2048, 200.7), (8192, 953.6))),
    *(CalibrationPoint(f"S2-{n // 1024}k", f"2023 vLLM prefill {n} tokens", "llama-3.1-70b",
                       "a100", 4, "bf16", "prefill", (n,), ms, None, "2023 vLLM")
      for n, ms in ((1024, 227.1), (2048, 403.3), (8192, 2278.5))),
    CalibrationPoint("S4-H100", "2023 vLLM decode, batch 1, prompt 512", "llama-3.1-70b", "h100",
                     4, "bf16", "decode", (1, 512), 29.4, None, "2023 vLLM"),
    CalibrationPoint("S4-A100", "2023 vLLM decode, batch 1, prompt 512", "llama-3.1-70b", "a100",
                     4, "bf16", "decode", (1, 512), 44.5, None, "2023 vLLM"),
    CalibrationPoint("S5-H100", "2023 vLLM decode, batch 64, prompt 512", "llama-3.1-70b", "h100",
                     4, "bf16", "decode", (64, 64 * 512), 52.4, None, "2023 vLLM"),
    CalibrationPoint("S5-A100", "2023 vLLM decode, batch 64, prompt 512", "llama-3.1-70b", "a100",
                     4, "bf16", "decode", (64, 64 * 512), 73.0, None, "2023 vLLM"),
    # Qwen3-235B-A22B: FP8 only (no published BF16 data found), from aiconfigurator's
    # silicon_sample.csv; our model runs TP where these used TP/EP.
    CalibrationPoint("Q-H100-c4", "TRT-LLM FP8 TP8/EP8 TPOT, conc 4, ISL 1k / OSL 512",
                     "qwen3-235b-a22b", "h100", 8, "fp8", "decode", (4, 4 * 1280), 11.6, None,
                     "EP8 vs our TP8"),
    CalibrationPoint("Q-H100-c64", "TRT-LLM FP8 TP8/EP8 TPOT, conc 64, ISL 1k / OSL 512",
                     "qwen3-235b-a22b", "h100", 8, "fp8", "decode", (64, 64 * 1280), 25.6, None,
                     "EP8 vs our TP8"),
    CalibrationPoint("Q-H200-c9", "SGLang FP8 TP4 TPOT, conc 9, ISL 1000 / OSL 2000",
                     "qwen3-235b-a22b", "h200", 4, "fp8", "decode", (9, 9 * 2000), 17.0, None),
    # Roofline floors at 100 % of peak (compute for prefill; weight, expert and KV bytes for
    # decode), computed from the specs and model shapes, for the cases without data.
    *(CalibrationPoint(f"F-{gpu}-b{b}", f"BF16 decode floor, batch {b} x 2k ctx",
                       "qwen3-235b-a22b", gpu, tp, "bf16", "decode", (b, b * 2048), ms, None,
                       "no BF16 data", floor=True)
      for gpu, tp, floors in (("a100", 8, (2.8, 12.6, 31.5)), ("h100", 8, (1.7, 7.7, 19.2)),
                              ("h200", 4, (2.3, 10.5, 25.4)))
      for b, ms in zip((1, 8, 64), floors, strict=True)),
    *(CalibrationPoint(f"F-{gpu}-pf{n}k", f"BF16 prefill compute floor, {n}k tokens",
                       "qwen3-235b-a22b", gpu, tp, "bf16", "prefill", (n * 1024,), ms, None,
                       "no BF16 data", floor=True)
      for gpu, tp, floors in (("a100", 8, (17.8, 36.9, 79.0)), ("h100", 8, (5.6, 11.6, 25.0)),
                              ("h200", 4, (11.2, 23.3, 50.0)))
      for n, ms in zip((1, 2, 4), floors, strict=True)),
    *(CalibrationPoint(f"F-llama-{gpu}-{what}", f"BF16 {what} floor", "llama-3.1-70b", gpu, 4,
                       "bf16", phase, args, ms, None, floor=True)
      for gpu, what, phase, args, ms in (
          ("h100", "prefill-1k", "prefill", (1024,), 35.8),
          ("a100", "prefill-1k", "prefill", (1024,), 113.0),
          ("h100", "decode-b1", "decode", (1, 512), 10.3),
          ("a100", "decode-b1", "decode", (1, 512), 16.9))),
)


@dataclass(frozen=True, slots=True)
class CalibrationResult:
    point: CalibrationPoint
    model_ms: float

    @property
    def error(self) -> float:
        """Relative error of the model against the measurement (positive = model slower)."""
        return self.model_ms / self.point.measured_ms - 1.0


def calibration_table(points: tuple[CalibrationPoint, ...] = CALIBRATION_POINTS,
                      ) -> list[CalibrationResult]:
    """Evaluate the latency model at each calibration point (with the shipped YAML constants)."""
    cache: dict[tuple, LatencyModel] = {}
    results = []
    for p in points:
        key = (p.model, p.gpu, p.tp, p.weight_dtype)
        if key not in cache:
            cache[key] = LatencyModel(p.model, p.gpu, p.tp, weight_dtype=p.weight_dtype)
        lm = cache[key]
        if p.phase == "prefill":
            seconds = lm.prefill_time(*p.args)
        elif p.phase == "decode":
            seconds = lm.decode_step_time(*p.args)
        elif p.phase == "linear-layer":
            seconds = lm.prefill_breakdown(*p.args)["linear"] / lm.model.num_hidden_layers
        else:
            raise ValueError(f"unknown calibration phase {p.phase!r}")
        results.append(CalibrationResult(p, seconds * 1e3))
    return results
