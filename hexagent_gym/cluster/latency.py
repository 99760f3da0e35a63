"""Roofline latency model: prefill time, decode step time and KV memory of one serving instance.

An instance is one model replica on ``tp`` GPUs of one type (tensor parallel). Each step time is a
roofline per operator group, ``max(FLOPs / (P * MFU), bytes / (BW * MBU))``, plus explicit TP
all-reduces and a fixed per-step overhead (docs/latency.md, "What is modelled", gives the terms):

* linear layers (q/k/v/o, dense FFN, MoE router, LM head in decode), weights read once per step;
* MoE experts: only the ``E_eff(N) = E * (1 - (1 - k/E)^N)`` experts that ``N`` tokens touch
  are read;
* attention: causal FlashAttention FLOPs in prefill, KV reads in decode;
* ``2 * layers`` all-reduces of ``tokens * hidden * 2`` bytes, each ``alpha + ring bytes / bus BW``;
* a fixed overhead ``a + b * log2(tp)`` per step (plus a per-layer cost for MoE routing).

Every efficiency constant comes from the GPU's YAML (``configs/gpus/*.yaml``, ``efficiency``);
docs/latency.md lists them and the calibration against published measurements
(``hexagent_gym.cluster.calibration``, printed by ``scripts/calibrate_latency.py``).

``prefill_time`` and ``decode_step_time`` sit in the simulator's hot loop, so ``__init__`` folds
everything into a handful of float coefficients and the two methods are scalar arithmetic only.
"""

from __future__ import annotations

import math
from pathlib import Path

from hexagent_gym.cluster.hardware import GIB, GpuSpec, ModelSpec, load_gpu, load_model
from hexagent_gym.config import ConfigError

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

    def prefill_time(self, input_tokens: int, cached_tokens: int = 0) -> float:
        """Seconds to prefill one prompt of ``input_tokens`` tokens whose first ``cached_tokens``
        are already in the prefix cache (an "extend" of the uncached suffix).

        The linear layers, all-reduce and MoE experts see only the ``n = input − cached`` new
        tokens (at least one: a full hit still computes the last token's logits); attention
        computes ``n`` queries against the whole context, ``2·L·q·(s² − h²)`` FLOPs, and reads the
        cached prefix's KV once.
        """
        s = input_tokens
        # h = 0 reduces every term to the from-scratch prefill exactly (x + 0.0 == x)
        h = 0 if cached_tokens <= 0 else (cached_tokens if cached_tokens < s else s - 1)
        n = s - h
        lin = n * self._pf_lin_flop
        if lin < self._lin_mem:
            lin = self._lin_mem
        att = (s * s - h * h) * self._pf_att_flop
        att_mem = n * self._pf_att_mem + h * self._kv_read
        if att < att_mem:
            att = att_mem
        t = lin + att + n * self._ar_tok + self._pf_const
        if self._moe:
            exp = n * self._pf_exp_flop
            exp_mem = self._exp_mem * (1.0 - self._route_miss ** n)
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
        """The terms of ``prefill_time`` (no cached prefix) in seconds; they sum to it."""
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
        # Causal attention: 2 * L * q_width * (s^2 - h^2) FLOPs for h cached of s tokens (s^2
        # without a prefix); bytes per new token: q in, o out, k/v in from the projections and k/v
        # out to the cache, plus one read of each cached token's KV.
        self._pf_att_flop = 2.0 * layers * q_gpu / (peak_bf16 * e.mfu_attention)
        att_tok_bytes = 4.0 * layers * q_gpu + kvb  # q + o activations, plus new KV
        self._pf_att_mem = (att_tok_bytes + kvb) / bw
        self._kv_read = kvb / bw  # a cached prefix token's KV, read once by an extend

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
