"""GPU and model specifications loaded from ``configs/gpus/*.yaml`` and ``configs/models/*.yaml``.

These are plain frozen records: datasheet numbers, the calibrated efficiency constants of each GPU,
and a model's shapes with the parameter counts derived from them. The latency model
(``hexagent_gym.cluster.latency``) turns them into step times; nothing here knows about time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from hexagent_gym.config import ConfigError, field, load_named, suggest

GIB = 2**30
"""Bytes per GiB. Memory capacities are in GiB (what nvidia-smi and vLLM count)."""


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Calibrated constants of one GPU type (the ``efficiency`` section of its YAML).

    They are properties of the GPU *and* of the serving stack the calibration points came from
    (modern vLLM with CUDA graphs); docs/latency.md justifies each value.
    """

    mfu_prefill: float
    """Share of peak FLOP/s reached by the linear-layer GEMMs at prefill sizes."""
    mfu_decode: float
    """Share of peak FLOP/s reached by the linear-layer GEMMs at decode batch sizes."""
    mfu_attention: float
    """Share of peak (BF16) FLOP/s reached by the attention kernels."""
    fp8_mfu_scale: float | None
    """Multiplies the MFUs when the GEMMs run in FP8 (None on GPUs without FP8 compute)."""
    mbu: float
    """Share of HBM bandwidth reached when streaming weights and KV."""
    allreduce_latency_us: float
    """Fixed latency of one tensor-parallel all-reduce call, microseconds."""
    allreduce_bus_efficiency: float
    """Achieved all-reduce bus bandwidth as a share of the GPU-GPU link (per direction)."""
    prefill_overhead_ms: float
    """Fixed time per prefill step at TP1, milliseconds."""
    decode_overhead_ms: float
    """Fixed time per decode step at TP1, milliseconds."""
    overhead_per_log2_tp_ms: float
    """Added to both fixed overheads per doubling of TP, milliseconds."""
    moe_layer_overhead_us: float
    """Fixed time per MoE layer per step (routing, permutation, grouped-GEMM setup), µs."""
    gpu_memory_utilization: float
    """Default share of HBM the engine may use (vLLM's ``gpu_memory_utilization``)."""
    reserved_gib: float
    """Memory per GPU inside that share that holds neither weights nor KV, GiB."""


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU type: datasheet figures (dense TFLOPS, per-direction bandwidths) and efficiencies."""

    name: str
    """Canonical lower-case name, e.g. ``h100``."""
    description: str
    bf16_tflops: float
    """Dense BF16 tensor TFLOPS (without 2:4 sparsity)."""
    fp8_tflops: float | None
    """Dense FP8 tensor TFLOPS, or None when the GPU has no FP8 tensor cores (A100)."""
    memory_gib: float
    """HBM capacity as the driver reports it, GiB."""
    memory_bw_tbs: float
    """HBM bandwidth, TB/s (1e12 B/s)."""
    nvlink_gbs: float | None
    """NVLink bandwidth per direction, GB/s; None for PCIe-only cards."""
    pcie_gbs: float
    """PCIe bandwidth per direction, GB/s."""
    nic_gbs: float
    """Scale-out network bandwidth per GPU per direction, GB/s (KV transfer between instances)."""
    efficiency: Efficiency
    source: str = ""
    """File the spec was loaded from."""

    @property
    def tp_link_gbs(self) -> float:
        """The link TP all-reduces run over: NVLink when present, else PCIe."""
        return self.nvlink_gbs if self.nvlink_gbs is not None else self.pcie_gbs


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer; field names follow the Hugging Face ``config.json``.

    A model is dense when ``intermediate_size`` is set and MoE when ``num_experts`` is set (every
    layer MoE, no shared expert: the Qwen3 MoE layout).
    """

    name: str
    """Canonical lower-case name, e.g. ``llama-3.1-70b``."""
    hf_id: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    intermediate_size: int | None = None
    """Dense SwiGLU FFN width (None for MoE models)."""
    num_experts: int | None = None
    num_experts_per_tok: int | None = None
    moe_intermediate_size: int | None = None
    tie_word_embeddings: bool = False
    source: str = ""

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def kv_bytes_per_token(self) -> int:
        """Logical BF16 KV bytes per token: 2 (K and V) x layers x KV heads x head dim x 2 B."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * 2

    @property
    def q_width(self) -> int:
        """Width of the query / attention output: heads x head dim (not always hidden_size)."""
        return self.num_attention_heads * self.head_dim

    @property
    def qo_params_per_layer(self) -> int:
        """q_proj + o_proj parameters of one layer (split across TP ranks)."""
        return 2 * self.hidden_size * self.q_width

    @property
    def kv_proj_params_per_head(self) -> int:
        """k_proj + v_proj parameters of one KV head in one layer (replicated when TP > n_kv)."""
        return 2 * self.hidden_size * self.head_dim

    @property
    def attn_params_per_layer(self) -> int:
        """q, k, v and o projection parameters of one layer."""
        return self.qo_params_per_layer + self.num_key_value_heads * self.kv_proj_params_per_head

    @property
    def dense_ffn_params_per_layer(self) -> int:
        """Gate, up and down projections of a dense FFN (0 for MoE)."""
        return 3 * self.hidden_size * self.intermediate_size if self.intermediate_size else 0

    @property
    def expert_params(self) -> int:
        """Parameters of one expert (gate, up, down); 0 for dense models."""
        return 3 * self.hidden_size * self.moe_intermediate_size if self.is_moe else 0

    @property
    def router_params_per_layer(self) -> int:
        return self.hidden_size * self.num_experts if self.is_moe else 0

    @property
    def embedding_params(self) -> int:
        """Input embedding plus LM head (one matrix when tied)."""
        copies = 1 if self.tie_word_embeddings else 2
        return copies * self.vocab_size * self.hidden_size

    @property
    def norm_params(self) -> int:
        """RMSNorm weights: two per layer plus the final norm."""
        return (2 * self.num_hidden_layers + 1) * self.hidden_size

    @property
    def total_params(self) -> int:
        per_layer = (self.attn_params_per_layer + self.dense_ffn_params_per_layer
                     + self.router_params_per_layer)
        if self.is_moe:
            per_layer += self.num_experts * self.expert_params
        return self.num_hidden_layers * per_layer + self.embedding_params + self.norm_params


_GPU_FIELDS = ("name", "description", "bf16_tflops", "fp8_tflops", "memory_gib", "memory_bw_tbs",
               "nvlink_gbs", "pcie_gbs", "nic_gbs", "efficiency")
_EFFICIENCY_FIELDS = tuple(f.name for f in fields(Efficiency))
_FRACTIONS = ("mfu_prefill", "mfu_decode", "mfu_attention", "mbu", "allreduce_bus_efficiency",
              "gpu_memory_utilization")
_NON_NEGATIVE = ("allreduce_latency_us", "prefill_overhead_ms", "decode_overhead_ms",
                 "overhead_per_log2_tp_ms", "moe_layer_overhead_us", "reserved_gib")
_MODEL_INTS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "vocab_size", "max_position_embeddings")
_MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")


def check_keys(data: Mapping[str, Any], allowed: tuple[str, ...], source: str) -> None:
    """Reject keys a config section does not define (typos would otherwise be silently ignored)."""
    for key in data:
        if key not in allowed:
            raise ConfigError(f"{source}: unknown field '{key}'; valid fields: "
                              f"{', '.join(allowed)}.{suggest(str(key), list(allowed))}")


def load_gpu(name_or_path: str | Path) -> GpuSpec:
    """Load a GPU spec by shipped name (case-insensitive, e.g. ``"H100"``) or YAML path.

    Raises:
        ConfigError: unknown name (with the known names and a suggestion) or an invalid field.
    """
    data, source = load_named("gpus", name_or_path)
    return gpu_from_dict(data, source)


def gpu_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> GpuSpec:
    """Build and validate a GpuSpec from a mapping with the GPU YAML schema."""
    check_keys(data, _GPU_FIELDS, source)
    fp8 = field(data, "fp8_tflops", source, (float, type(None)), default=None)
    nvlink = field(data, "nvlink_gbs", source, (float, type(None)), default=None)
    for key, value in (("fp8_tflops", fp8), ("nvlink_gbs", nvlink)):
        if value is not None and value <= 0:
            raise ConfigError(f"{source}: field '{key}' must be > 0 or null, got {value!r}")
    eff_data = field(data, "efficiency", source, dict)
    eff_source = f"{source} (efficiency)"
    check_keys(eff_data, _EFFICIENCY_FIELDS, eff_source)
    values: dict[str, Any] = {}
    for key in _EFFICIENCY_FIELDS:
        if key == "fp8_mfu_scale":
            if fp8 is None:
                values[key] = field(eff_data, key, eff_source, (float, type(None)), default=None)
            else:
                values[key] = field(eff_data, key, eff_source, float, positive=True)
            continue
        value = field(eff_data, key, eff_source, float)
        if key in _FRACTIONS and not 0 < value <= 1:
            raise ConfigError(f"{eff_source}: field '{key}' must be in (0, 1], got {value!r}")
        if key in _NON_NEGATIVE and value < 0:
            raise ConfigError(f"{eff_source}: field '{key}' must be >= 0, got {value!r}")
        values[key] = value
    return GpuSpec(
        name=field(data, "name", source, str).strip().lower(),
        description=field(data, "description", source, str, default=""),
        bf16_tflops=field(data, "bf16_tflops", source, float, positive=True),
        fp8_tflops=fp8,
        memory_gib=field(data, "memory_gib", source, float, positive=True),
        memory_bw_tbs=field(data, "memory_bw_tbs", source, float, positive=True),
        nvlink_gbs=nvlink,
        pcie_gbs=field(data, "pcie_gbs", source, float, positive=True),
        nic_gbs=field(data, "nic_gbs", source, float, positive=True),
        efficiency=Efficiency(**values),
        source=source,
    )


def load_model(name_or_path: str | Path) -> ModelSpec:
    """Load a model spec by shipped name (case-insensitive, e.g. ``"Llama-3.1-70B"``) or YAML path.

    Raises:
        ConfigError: unknown name (with the known names and a suggestion) or an invalid field.
    """
    data, source = load_named("models", name_or_path)
    return model_from_dict(data, source)


def model_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> ModelSpec:
    """Build and validate a ModelSpec from a mapping with the model YAML schema."""
    allowed = ("name", "hf_id", *_MODEL_INTS, "intermediate_size", *_MOE_FIELDS,
               "tie_word_embeddings")
    check_keys(data, allowed, source)
    ints = {key: field(data, key, source, int, positive=True) for key in _MODEL_INTS}
    dense = field(data, "intermediate_size", source, int, default=None, positive=True)
    moe = {key: field(data, key, source, int, default=None, positive=True) for key in _MOE_FIELDS}
    if (dense is None) == all(v is None for v in moe.values()):
        raise ConfigError(f"{source}: set either 'intermediate_size' (dense FFN) or "
                          f"{', '.join(_MOE_FIELDS)} (MoE FFN), not both or neither")
    if dense is None:
        missing = [key for key, value in moe.items() if value is None]
        if missing:
            raise ConfigError(f"{source}: missing required field '{missing[0]}' of an MoE model")
        if moe["num_experts_per_tok"] > moe["num_experts"]:
            raise ConfigError(f"{source}: field 'num_experts_per_tok' "
                              f"({moe['num_experts_per_tok']}) exceeds 'num_experts' "
                              f"({moe['num_experts']})")
    if ints["num_attention_heads"] % ints["num_key_value_heads"]:
        raise ConfigError(f"{source}: field 'num_key_value_heads' ({ints['num_key_value_heads']}) "
                          f"must divide 'num_attention_heads' ({ints['num_attention_heads']})")
    return ModelSpec(
        name=field(data, "name", source, str).strip().lower(),
        hf_id=field(data, "hf_id", source, str, default=""),
        intermediate_size=dense,
        tie_word_embeddings=field(data, "tie_word_embeddings", source, bool, default=False),
        source=source,
        **ints,
        **moe,
    )
