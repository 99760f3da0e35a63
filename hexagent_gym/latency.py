"""Roofline latency model: prefill time, decode step time and KV memory of one serving instance.

An instance is one model replica on ``tp`` GPUs of one type (tensor parallel). Each step time is a
roofline per operator group, ``max(FLOPs / (P * MFU), bytes / (BW * MBU))``, plus explicit TP
all-reduces and a fixed per-step overhead (shared/reference/hardware.md §3.6):

* linear layers (q/k/v/o, dense FFN, MoE router, LM head in decode), weights read once per step;
* MoE experts: only the ``E_eff(N) = E * (1 - (1 - k/E)^N)`` experts that ``N`` tokens touch
  are read;
* attention: causal FlashAttention FLOPs in prefill, KV reads in decode;
* ``2 * layers`` all-reduces of ``tokens * hidden * 2`` bytes, each ``alpha + ring bytes / bus BW``;
* a fixed overhead ``a + b * log2(tp)`` per step (plus a per-layer cost for MoE routing).

Every efficiency constant comes from the GPU's YAML (``configs/gpus/*.yaml``, ``efficiency``);
docs/latency.md lists them and the calibration against published measurements
(``calibration_table`` below, printed by ``scripts/calibrate_latency.py``).

``prefill_time`` and ``decode_step_time`` sit in the simulator's hot loop, so ``__init__`` folds
everything into a handful of float coefficients and the two methods are scalar arithmetic only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from hexagent_gym.config import ConfigError
from hexagent_gym.hardware import GIB, GpuSpec, ModelSpec, load_gpu, load_model

WEIGHT_DTYPES = {"bf16": 2, "fp8": 1}
"""Weight dtype -> bytes per linear-layer weight (embeddings, LM head, norms, router stay BF16)."""
TP_DEGREES = (1, 2, 4, 8)
"""Tensor-parallel degrees an instance may use (one 8-GPU node at most)."""
_BF16 = 2  # bytes per activation, KV element and non-quantised weight


def check_tp(model: ModelSpec, tp: int) -> None:
    """Raise ConfigError unless ``tp`` is a valid tensor-parallel degree for ``model``.

    Valid: a power of two <= 8 that divides the attention heads and the FFN / expert width, and
    either divides the KV heads or is a multiple of them (vLLM then replicates KV heads).
    """
    if isinstance(tp, bool) or not isinstance(tp, int) or tp not in TP_DEGREES:
        raise ConfigError(f"tp must be one of {', '.join(map(str, TP_DEGREES))} "
                          f"(a power of two <= 8), got {tp!r}")
    n_kv = model.num_key_value_heads
    problems = []
    if model.num_attention_heads % tp:
        problems.append(f"num_attention_heads {model.num_attention_heads}")
    if n_kv % tp and tp % n_kv:
        problems.append(f"num_key_value_heads {n_kv} (neither divides the other)")
    width = model.moe_intermediate_size if model.is_moe else model.intermediate_size
    if width % tp:
        problems.append(f"FFN width {width}")
    if problems:
        raise ConfigError(f"tp={tp} does not divide {model.name}'s {', '.join(problems)}; "
                          f"choose a tp that does")


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads each TP rank holds: n_kv / tp, or 1 (replicated) when tp >= n_kv, as in vLLM."""
    return max(model.num_key_value_heads // tp, 1)


def kv_bytes_per_token_per_gpu(model: ModelSpec, tp: int) -> int:
    """BF16 KV bytes one GPU stores per token, counting the TP replication of KV heads."""
    return 2 * model.num_hidden_layers * model.head_dim * _BF16 * kv_heads_per_gpu(model, tp)


def weights_bytes_per_gpu(model: ModelSpec, tp: int, weight_dtype: str = "bf16") -> int:
    """Weight bytes resident on each GPU of a TP group.

    Linear layers (attention projections, FFN, experts) use ``weight_dtype``; q/o and FFN are split
    across ranks, k/v follow ``kv_heads_per_gpu`` (replicated when tp > n_kv). Embedding and LM
    head are vocab-parallel in BF16; norms and the MoE router are replicated in BF16.
    """
    b_lin = WEIGHT_DTYPES[weight_dtype]
    layers = model.num_hidden_layers
    linear = (model.qo_params_per_layer // tp
              + kv_heads_per_gpu(model, tp) * model.kv_proj_params_per_head
              + model.dense_ffn_params_per_layer // tp)
    if model.is_moe:
        linear += model.num_experts * model.expert_params // tp
    vocab_rows = -(-model.vocab_size // tp)
    copies = 1 if model.tie_word_embeddings else 2
    bf16_params = (layers * model.router_params_per_layer + copies * vocab_rows * model.hidden_size
                   + model.norm_params)
    return layers * linear * b_lin + bf16_params * _BF16


def _memory_need(model: ModelSpec, gpu: GpuSpec, tp: int, weight_dtype: str, utilization: float,
                 min_kv_tokens: int) -> tuple[float, float, float]:
    """(needed, available, weights) bytes per GPU for holding the weights plus ``min_kv_tokens``."""
    weights = weights_bytes_per_gpu(model, tp, weight_dtype)
    needed = (weights + gpu.efficiency.reserved_gib * GIB
              + min_kv_tokens * kv_bytes_per_token_per_gpu(model, tp))
    return needed, utilization * gpu.memory_gib * GIB, weights


def _fitting_tps(model: ModelSpec, gpu: GpuSpec, weight_dtype: str, utilization: float,
                 min_kv_tokens: int) -> list[int]:
    fits = []
    for tp in TP_DEGREES:
        try:
            check_tp(model, tp)
        except ConfigError:
            continue
        needed, available, _ = _memory_need(model, gpu, tp, weight_dtype, utilization,
                                            min_kv_tokens)
        if needed <= available:
            fits.append(tp)
    return fits


class LatencyModel:
    """Step times and KV memory of one instance: ``model`` on ``tp`` GPUs of type ``gpu``.

    Args:
        model: model name (case-insensitive), YAML path or ModelSpec.
        gpu: GPU name (case-insensitive), YAML path or GpuSpec.
        tp: tensor-parallel degree (1, 2, 4 or 8; must suit the model's head counts).
        weight_dtype: ``"bf16"`` or ``"fp8"``. FP8 halves linear-layer weight bytes and, on GPUs
            with FP8 tensor cores, runs those GEMMs at the FP8 peak; on GPUs without (A100) it is
            weight-only and computes at the BF16 peak. KV always stays BF16.
        gpu_memory_utilization: share of HBM the engine may use; None takes the GPU YAML default.
        min_kv_tokens: the KV the instance must hold at least; None means one request of the
            model's full context (vLLM refuses to start otherwise).

    Raises:
        ConfigError: unknown name, bad tp / dtype / utilisation, or the model does not fit (the
            message gives the memory needed and available per GPU and the TP degrees that fit).
    """

    def __init__(self, model: str | Path | ModelSpec, gpu: str | Path | GpuSpec, tp: int,
                 weight_dtype: str = "bf16", gpu_memory_utilization: float | None = None,
                 min_kv_tokens: int | None = None) -> None:
        self.model: ModelSpec = model if isinstance(model, ModelSpec) else load_model(model)
        self.gpu: GpuSpec = gpu if isinstance(gpu, GpuSpec) else load_gpu(gpu)
        m, g, e = self.model, self.gpu, self.gpu.efficiency
        check_tp(m, tp)
        self.tp: int = tp
        dtype = str(weight_dtype).strip().lower()
        if dtype not in WEIGHT_DTYPES:
            raise ConfigError(f"weight_dtype must be one of {', '.join(WEIGHT_DTYPES)}, "
                              f"got {weight_dtype!r}")
        self.weight_dtype: str = dtype
        util = e.gpu_memory_utilization if gpu_memory_utilization is None \
            else gpu_memory_utilization
        if isinstance(util, bool) or not isinstance(util, int | float) or not 0 < util <= 1:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], "
                              f"got {gpu_memory_utilization!r}")
        self.gpu_memory_utilization: float = float(util)
        self.kv_bytes_per_token: int = m.kv_bytes_per_token
        self.kv_bytes_per_token_per_gpu: int = kv_bytes_per_token_per_gpu(m, tp)
        self.weights_bytes_per_gpu: int = weights_bytes_per_gpu(m, tp, dtype)
        self._check_fit(m.max_position_embeddings if min_kv_tokens is None else min_kv_tokens)
        free = (self.gpu_memory_utilization * g.memory_gib - e.reserved_gib) * GIB \
            - self.weights_bytes_per_gpu
        self._kv_capacity_tokens = int(free // self.kv_bytes_per_token_per_gpu)
        self._precompute()

    # ---------------------------------------------------------------------------------------------
    # Hot path: scalar arithmetic on precomputed coefficients (see _precompute for their meaning).

    def prefill_time(self, input_tokens: int) -> float:
        """Seconds to prefill one sequence of ``input_tokens`` new tokens (no cached prefix)."""
        s = input_tokens
        lin = s * self._pf_lin_flop
        if lin < self._lin_mem:
            lin = self._lin_mem
        att = s * s * self._pf_att_flop
        att_mem = s * self._pf_att_mem
        if att < att_mem:
            att = att_mem
        t = lin + att + s * self._ar_tok + self._pf_const
        if self._moe:
            exp = s * self._pf_exp_flop
            exp_mem = self._exp_mem * (1.0 - self._route_miss ** s)
            t += exp if exp > exp_mem else exp_mem
        return t

    def decode_step_time(self, batch_size: int, context_tokens: int) -> float:
        """Seconds for one decode step of ``batch_size`` sequences.

        ``context_tokens`` is the KV the step reads: the sum of the sequences' context lengths.
        """
        b = batch_size
        lin = b * self._dc_lin_flop
        if lin < self._dc_lin_mem:
            lin = self._dc_lin_mem
        t = lin + context_tokens * self._dc_ctx + b * self._dc_tok + self._dc_const
        if self._moe:
            exp = b * self._dc_exp_flop
            exp_mem = self._exp_mem * (1.0 - self._route_miss ** b)
            t += exp if exp > exp_mem else exp_mem
        return t

    def kv_bytes(self, tokens: int) -> int:
        """Logical BF16 KV bytes of ``tokens`` tokens (what a P->D transfer moves)."""
        return tokens * self.kv_bytes_per_token

    def kv_capacity_tokens(self) -> int:
        """Tokens of KV the instance holds: free memory per GPU / KV bytes per GPU per token."""
        return self._kv_capacity_tokens

    # ---------------------------------------------------------------------------------------------
    # Inspection (not on the hot path)

    def prefill_breakdown(self, input_tokens: int) -> dict[str, float]:
        """The terms of ``prefill_time`` in seconds; they sum to it."""
        s = input_tokens
        return {
            "linear": max(s * self._pf_lin_flop, self._lin_mem),
            "lm_head": self._pf_lm_head,
            "attention": max(s * s * self._pf_att_flop, s * self._pf_att_mem),
            "experts": max(s * self._pf_exp_flop, self._exp_mem * (1.0 - self._route_miss ** s))
            if self._moe else 0.0,
            "allreduce": self._ar_calls + s * self._ar_tok,
            "overhead": self._pf_overhead,
        }

    def decode_breakdown(self, batch_size: int, context_tokens: int) -> dict[str, float]:
        """The terms of ``decode_step_time`` in seconds; they sum to it."""
        b = batch_size
        return {
            "linear": max(b * self._dc_lin_flop, self._dc_lin_mem),
            "attention": context_tokens * self._dc_ctx + b * self._dc_att_tok,
            "experts": max(b * self._dc_exp_flop, self._exp_mem * (1.0 - self._route_miss ** b))
            if self._moe else 0.0,
            "allreduce": self._ar_calls + b * self._ar_tok,
            "overhead": self._dc_overhead,
        }

    def experts_touched(self, tokens: int) -> float:
        """Expected distinct experts per layer read by ``tokens`` tokens (0 for dense models)."""
        if not self._moe:
            return 0.0
        return self.model.num_experts * (1.0 - self._route_miss ** tokens)

    def __repr__(self) -> str:
        return (f"LatencyModel(model={self.model.name!r}, gpu={self.gpu.name!r}, tp={self.tp}, "
                f"weight_dtype={self.weight_dtype!r})")

    # ---------------------------------------------------------------------------------------------

    def _check_fit(self, min_kv_tokens: int) -> None:
        m, g, util, dtype = self.model, self.gpu, self.gpu_memory_utilization, self.weight_dtype
        if isinstance(min_kv_tokens, bool) or not isinstance(min_kv_tokens, int) \
                or min_kv_tokens < 1:
            raise ConfigError(f"min_kv_tokens must be a positive int, got {min_kv_tokens!r}")
        needed, available, weights = _memory_need(m, g, self.tp, dtype, util, min_kv_tokens)
        if needed <= available:
            return
        kv = needed - weights - g.efficiency.reserved_gib * GIB
        msg = (f"{m.name} ({dtype}) does not fit on {g.name} at tp={self.tp}: it needs "
               f"{needed / GIB:.1f} GiB per GPU (weights {weights / GIB:.1f} + reserved "
               f"{g.efficiency.reserved_gib:.1f} + KV for {min_kv_tokens} tokens {kv / GIB:.1f}), "
               f"has {available / GIB:.1f} GiB (gpu_memory_utilization {util:g} x "
               f"{g.memory_gib:g} GiB).")
        fits = _fitting_tps(m, g, dtype, util, min_kv_tokens)
        msg += (f" TP degrees that fit on {g.name} in {dtype}: {', '.join(map(str, fits))}."
                if fits else f" No TP degree of {', '.join(map(str, TP_DEGREES))} fits on "
                f"{g.name} in {dtype}.")
        if dtype == "bf16":
            fp8_fits = _fitting_tps(m, g, "fp8", util, min_kv_tokens)
            if self.tp in fp8_fits:
                msg += f" `weight_dtype: fp8` would fit at tp={self.tp}."
            elif fp8_fits:
                msg += (f" With `weight_dtype: fp8` these fit: "
                        f"{', '.join(map(str, fp8_fits))}.")
        raise ConfigError(msg)

    def _precompute(self) -> None:
        """Fold specs and efficiencies into per-token coefficients, all in seconds."""
        m, g, e, tp = self.model, self.gpu, self.gpu.efficiency, self.tp
        layers, hidden = m.num_hidden_layers, m.hidden_size
        fp8 = self.weight_dtype == "fp8"
        b_lin = WEIGHT_DTYPES[self.weight_dtype]
        peak_bf16 = g.bf16_tflops * 1e12
        # Linear GEMMs run at the FP8 peak only when the GPU has FP8 tensor cores.
        if fp8 and g.fp8_tflops is not None:
            peak_lin = g.fp8_tflops * 1e12 * e.fp8_mfu_scale
        else:
            peak_lin = peak_bf16
        bw = g.memory_bw_tbs * 1e12 * e.mbu  # achieved HBM bytes/s
        kvb = self.kv_bytes_per_token_per_gpu
        q_gpu = m.q_width // tp  # attention width per rank

        # Per-GPU parameters of the non-expert linear layers (all layers) and the LM head.
        lin_params = layers * (m.qo_params_per_layer // tp
                               + kv_heads_per_gpu(m, tp) * m.kv_proj_params_per_head
                               + m.dense_ffn_params_per_layer // tp)
        router_params = layers * m.router_params_per_layer  # replicated, BF16
        lin_bytes = lin_params * b_lin + router_params * _BF16
        lm_params = -(-m.vocab_size // tp) * hidden
        lm_bytes = lm_params * _BF16
        lin_flops_tok = 2.0 * (lin_params + router_params)
        lm_flops_tok = 2.0 * lm_params

        # Prefill: linear layers for every token; LM head for the last token only.
        self._pf_lin_flop = lin_flops_tok / (peak_lin * e.mfu_prefill)
        self._lin_mem = lin_bytes / bw
        self._pf_lm_head = max(lm_flops_tok / (peak_bf16 * e.mfu_prefill), lm_bytes / bw)
        # Causal attention, no prefix: 2 * L * q_width * s^2 FLOPs; bytes per token: q in, o out,
        # k/v in from the projections and k/v out to the cache.
        self._pf_att_flop = 2.0 * layers * q_gpu / (peak_bf16 * e.mfu_attention)
        att_tok_bytes = 4.0 * layers * q_gpu + kvb  # q + o activations, plus new KV
        self._pf_att_mem = (att_tok_bytes + kvb) / bw

        # Decode: LM head for every sequence, so it joins the linear group.
        self._dc_lin_flop = (lin_flops_tok / (peak_lin * e.mfu_decode)
                             + lm_flops_tok / (peak_bf16 * e.mfu_decode))
        self._dc_lin_mem = (lin_bytes + lm_bytes) / bw
        # Attention over the context: FLOPs 4 * L * q_width per context token, bytes = KV read;
        # GQA's intensity (8-16 FLOP/B) keeps it memory-bound, so one coefficient suffices.
        self._dc_ctx = max(4.0 * layers * q_gpu / (peak_bf16 * e.mfu_attention), kvb / bw)
        self._dc_att_tok = att_tok_bytes / bw

        # MoE experts: FLOPs of the top-k experts per token; bytes of each distinct expert touched.
        self._moe = m.is_moe
        if m.is_moe:
            expert_flops_tok = 2.0 * layers * m.num_experts_per_tok * (m.expert_params // tp)
            self._pf_exp_flop = expert_flops_tok / (peak_lin * e.mfu_prefill)
            self._dc_exp_flop = expert_flops_tok / (peak_lin * e.mfu_decode)
            self._exp_mem = layers * m.num_experts * (m.expert_params // tp) * b_lin / bw
            self._route_miss = 1.0 - m.num_experts_per_tok / m.num_experts
            moe_overhead = layers * e.moe_layer_overhead_us * 1e-6
        else:
            self._pf_exp_flop = self._dc_exp_flop = self._exp_mem = 0.0
            self._route_miss = 1.0
            moe_overhead = 0.0

        # TP all-reduce: 2 per layer, each alpha + ring bytes (2(t-1)/t * tokens*hidden*2) / bus BW.
        if tp > 1:
            bus = g.tp_link_gbs * 1e9 * e.allreduce_bus_efficiency
            ring_bytes_tok = 2.0 * (tp - 1) / tp * hidden * _BF16
            self._ar_calls = 2 * layers * e.allreduce_latency_us * 1e-6
            self._ar_tok = 2 * layers * ring_bytes_tok / bus
        else:
            self._ar_calls = self._ar_tok = 0.0

        log_tp = math.log2(tp) * e.overhead_per_log2_tp_ms
        self._pf_overhead = (e.prefill_overhead_ms + log_tp) * 1e-3 + moe_overhead
        self._dc_overhead = (e.decode_overhead_ms + log_tp) * 1e-3 + moe_overhead
        self._pf_const = self._pf_lm_head + self._ar_calls + self._pf_overhead
        self._dc_const = self._ar_calls + self._dc_overhead
        self._dc_tok = self._dc_att_tok + self._ar_tok


# -------------------------------------------------------------------------------------------------
# Calibration against published measurements (shared/reference/hardware.md §4-§5)


@dataclass(frozen=True, slots=True)
class CalibrationPoint:
    """One published measurement and the instance / step that reproduces it."""

    point: str
    """Label, e.g. ``S1-1k`` (the row of hardware.md §5)."""
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
_TOLERANCE = 0.25  # for the modern-stack points; docs/latency.md explains the choice
CALIBRATION_POINTS: tuple[CalibrationPoint, ...] = (
    # Modern-stack rules of thumb (BF16 Llama-70B TPOT at batch <= 8; prefill per 1k tokens).
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
    # Vidur per-layer linear GEMM times (calibrate MFU / MBU separately from overheads).
    *(CalibrationPoint(f"Vidur-A100-{n}", f"one layer's linear GEMMs, {n} tokens",
                       "llama-3.1-70b", "a100", 4, "bf16", "linear-layer", (n,), ms, _TOLERANCE)
      for n, ms in ((1, 0.285), (512, 1.05), (2048, 3.90), (8192, 14.75))),
    *(CalibrationPoint(f"Vidur-H100-{n}", f"one layer's linear GEMMs, {n} tokens",
                       "llama-3.1-70b", "h100", 4, "bf16", "linear-layer", (n,), ms, _TOLERANCE)
      for n, ms in ((1, 0.159), (512, 0.330), (2048, 1.22), (4096, 2.37))),
    # Modern FP8 serving (aiconfigurator silicon, vLLM; NVIDIA NIM), Llama-3.x-70B.
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
    # 2023 vLLM (Splitwise perf_model.csv): reference only, the model should be faster.
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
    # Qwen3-235B-A22B: FP8 only (no BF16 data exists); our model runs TP where these used TP/EP.
    CalibrationPoint("Q-H100-c4", "TRT-LLM FP8 TP8/EP8 TPOT, conc 4, ISL 1k / OSL 512",
                     "qwen3-235b-a22b", "h100", 8, "fp8", "decode", (4, 4 * 1280), 11.6, None,
                     "EP8 vs our TP8"),
    CalibrationPoint("Q-H100-c64", "TRT-LLM FP8 TP8/EP8 TPOT, conc 64, ISL 1k / OSL 512",
                     "qwen3-235b-a22b", "h100", 8, "fp8", "decode", (64, 64 * 1280), 25.6, None,
                     "EP8 vs our TP8"),
    CalibrationPoint("Q-H200-c9", "SGLang FP8 TP4 TPOT, conc 9, ISL 1000 / OSL 2000",
                     "qwen3-235b-a22b", "h200", 4, "fp8", "decode", (9, 9 * 2000), 17.0, None),
    # Floors at 100 % of peak [DERIVED in hardware.md §5.1 / §5.3], for the cases without data.
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
