"""Latency model: hand-computed memory and step times, monotonicity, MoE routing, calibration."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from hexagent_gym.cluster.calibration import CALIBRATION_POINTS, calibration_table
from hexagent_gym.cluster.hardware import GIB, load_gpu, load_model
from hexagent_gym.cluster.latency import LatencyModel, weights_bytes_per_gpu
from hexagent_gym.config import ConfigError, known_names

H100_BW = 3.35e12 * 0.80  # memory_bw_tbs x mbu from configs/gpus/h100.yaml


@pytest.fixture(scope="module")
def llama70_h100() -> LatencyModel:
    return LatencyModel("llama-3.1-70b", "h100", 4)


@pytest.fixture(scope="module")
def qwen_h200() -> LatencyModel:
    return LatencyModel("qwen3-235b-a22b", "h200", 4)


def test_kv_bytes_are_exact_logical_bf16():
    assert LatencyModel("llama-3.1-70b", "h100", 4).kv_bytes(1) == 327_680
    assert LatencyModel("llama-3.1-70b", "a100", 8).kv_bytes(2048) == 2048 * 327_680
    assert LatencyModel("qwen3-235b-a22b", "h100", 8).kv_bytes(1) == 192_512
    assert LatencyModel("llama-3.1-8b", "h100", 1).kv_bytes(10) == 1_310_720


def test_parameter_counts_match_the_published_checkpoints():
    # Parameter counts of the Hugging Face checkpoints; for Qwen3 only to the published precision
    # (its per-head q/k norms, 256 parameters per layer, are not modelled).
    assert load_model("llama-3.1-70b").total_params == 70_553_706_496
    assert load_model("llama-3.1-8b").total_params == 8_030_261_248
    assert load_model("qwen3-235b-a22b").total_params == pytest.approx(235.09e9, rel=1e-4)
    assert load_model("qwen3-30b-a3b").total_params == pytest.approx(30.53e9, rel=1e-4)


def test_kv_capacity_hand_computed_llama70b_a100_tp4():
    lm = LatencyModel("llama-3.1-70b", "a100", 4, gpu_memory_utilization=0.9)
    # Per GPU and layer: q+o 2*8192*8192/4, k+v 2 heads * 2*8192*128, FFN 3*8192*28672/4.
    per_layer = 33_554_432 + 4_194_304 + 176_160_768
    # BF16 linear layers + vocab-parallel embedding and LM head (128256/4 rows) + 161 norms.
    weights = 80 * per_layer * 2 + (2 * 32_064 * 8192 + 161 * 8192) * 2
    assert weights == 35_278_831_616 == lm.weights_bytes_per_gpu
    free = (0.9 * 80.0 - 4.0) * GIB - weights  # util x HBM - reserved (a100.yaml) - weights
    assert lm.kv_bytes_per_token_per_gpu == 327_680 // 4
    assert lm.kv_capacity_tokens() == int(free // 81_920) == 460_639


def test_qwen_tp8_replicates_kv_heads():
    tp8 = LatencyModel("qwen3-235b-a22b", "h100", 8)
    tp4 = LatencyModel("qwen3-235b-a22b", "h200", 4)
    # 4 KV heads: TP4 holds one head per GPU; TP8 still holds one (a replica) per GPU.
    assert tp4.kv_bytes_per_token_per_gpu == tp8.kv_bytes_per_token_per_gpu == 48_128
    assert 8 * tp8.kv_bytes_per_token_per_gpu == 2 * tp8.kv_bytes(1)
    weights = tp8.weights_bytes_per_gpu
    free = (0.9 * 79.65 - 4.0) * GIB - weights
    assert tp8.kv_capacity_tokens() == int(free // 48_128)
    # TP8 vs half of TP4: k/v projections stay one head per GPU (half a head more), and the
    # replicated BF16 router and norms do not halve.
    model = tp8.model
    extra = 94 * model.kv_proj_params_per_head + 94 * 4096 * 128 + model.norm_params  # x2 B / 2
    assert weights - weights_bytes_per_gpu(model, 4) // 2 == extra


def test_decode_step_hand_computed_llama8b_h100_tp1():
    lm = LatencyModel("llama-3.1-8b", "h100", 1)
    linear_params = 32 * (2 * 4096 * 4096 + 8 * 2 * 4096 * 128 + 3 * 4096 * 14336)
    lm_head = 128_256 * 4096
    kvb = 131_072
    # Memory-bound: weights + LM head read once, KV of the context read, q/o and new KV per token.
    expected = ((linear_params + lm_head) * 2 + 1000 * kvb + 4 * 32 * 4096 + kvb) / H100_BW
    expected += 1.5e-3  # decode_overhead_ms at TP1, no all-reduce
    assert lm.decode_step_time(1, 1000) == pytest.approx(expected, rel=1e-12)


def test_prefill_hand_computed_llama8b_h100_tp1():
    lm = LatencyModel("llama-3.1-8b", "h100", 1)
    s = 2048
    linear_params = 32 * (2 * 4096 * 4096 + 8 * 2 * 4096 * 128 + 3 * 4096 * 14336)
    linear = 2 * linear_params * s / (989e12 * 0.72)  # compute-bound at 2k tokens
    lm_head = 128_256 * 4096 * 2 / H100_BW  # last token only: memory-bound
    attention = 2 * 32 * 4096 * s * s / (989e12 * 0.50)  # causal FlashAttention
    expected = linear + lm_head + attention + 2.0e-3  # prefill_overhead_ms
    assert lm.prefill_time(s) == pytest.approx(expected, rel=1e-12)


def test_prefill_monotone_in_tokens(llama70_h100, qwen_h200):
    for lm in (llama70_h100, qwen_h200, LatencyModel("llama-3.1-8b", "a100", 1)):
        times = [lm.prefill_time(s) for s in (1, 2, 16, 100, 512, 1000, 2048, 4096, 8192, 32768)]
        assert all(a < b for a, b in zip(times, times[1:], strict=False)), lm


def test_decode_monotone_in_batch_and_context(llama70_h100, qwen_h200):
    for lm in (llama70_h100, qwen_h200):
        by_batch = [lm.decode_step_time(b, 50_000) for b in (1, 2, 4, 8, 32, 64, 128, 256)]
        assert all(a < b for a, b in zip(by_batch, by_batch[1:], strict=False)), lm
        by_ctx = [lm.decode_step_time(16, c) for c in (0, 1000, 10_000, 100_000, 400_000)]
        assert all(a < b for a, b in zip(by_ctx, by_ctx[1:], strict=False)), lm


def test_moe_experts_touched_matches_reference(qwen_h200):
    # E_eff(N) = E * (1 - (1 - k/E)^N) worked by hand for E = 128, k = 8.
    assert qwen_h200.experts_touched(1) == pytest.approx(8.0)
    assert qwen_h200.experts_touched(4) == pytest.approx(29.1, abs=0.05)
    assert qwen_h200.experts_touched(8) == pytest.approx(51.6, abs=0.05)
    assert qwen_h200.experts_touched(64) == pytest.approx(125.9, abs=0.05)
    assert LatencyModel("llama-3.1-70b", "h100", 4).experts_touched(8) == 0.0


def test_moe_decode_expert_reads_grow_with_batch(qwen_h200):
    experts = [qwen_h200.decode_breakdown(b, 0)["experts"] for b in (1, 4, 8, 64)]
    assert all(a < b for a, b in zip(experts, experts[1:], strict=False))
    # Memory-bound at small batch: the expert term scales with E_eff exactly.
    assert experts[2] / experts[0] == pytest.approx(qwen_h200.experts_touched(8) / 8.0)
    # One expert of one layer in BF16 split 4 ways, read at H200's 4.8 TB/s x 0.8.
    per_expert = 94 * 3 * 4096 * 1536 // 4 * 2 / (4.8e12 * 0.8)
    assert experts[0] == pytest.approx(8 * per_expert)


def test_moe_short_prefill_is_bound_by_expert_reads():
    lm = LatencyModel("qwen3-235b-a22b", "h100", 8)
    parts = lm.prefill_breakdown(1024)
    # All experts: 94 layers x 128 x 3*4096*1536 params / 8 GPUs x 2 B = 56.8 GB per GPU, ~17 ms
    # at 3.35 TB/s and 100 % BW, more than the ~5.6 ms compute floor; we divide by MBU 0.8 on top.
    assert parts["experts"] == pytest.approx(17e-3 / 0.8, rel=0.03)


def test_tp1_has_no_allreduce_term():
    tp1 = LatencyModel("llama-3.1-8b", "h100", 1)
    assert tp1.prefill_breakdown(4096)["allreduce"] == 0.0
    assert tp1.decode_breakdown(64, 100_000)["allreduce"] == 0.0
    tp4 = LatencyModel("llama-3.1-8b", "h100", 4)
    # 2 per layer, alpha 5 us + ring (2*3/4 * 64 tokens * 4096 * 2 B) / (450 GB/s * 0.7).
    expected = 64 * (5e-6 + 1.5 * 64 * 4096 * 2 / (450e9 * 0.7))
    assert tp4.decode_breakdown(64, 0)["allreduce"] == pytest.approx(expected)


@pytest.mark.parametrize("spec", [("llama-3.1-70b", "a100", 4), ("qwen3-235b-a22b", "a100", 8),
                                  ("llama-3.1-8b", "h200", 2), ("qwen3-30b-a3b", "l40s", 2)])
def test_breakdowns_sum_to_hot_path(spec):
    lm = LatencyModel(*spec)
    for s in (1, 300, 5000):
        assert sum(lm.prefill_breakdown(s).values()) == pytest.approx(lm.prefill_time(s))
    for b, c in ((1, 10), (17, 30_000), (256, 500_000)):
        assert sum(lm.decode_breakdown(b, c).values()) == pytest.approx(lm.decode_step_time(b, c))


def test_fp8_halves_linear_weights_and_is_weight_only_on_a100():
    bf16 = LatencyModel("llama-3.1-70b", "a100", 4)
    fp8 = LatencyModel("llama-3.1-70b", "a100", 4, weight_dtype="FP8")
    linear_bf16 = 80 * (33_554_432 + 4_194_304 + 176_160_768) * 2
    assert bf16.weights_bytes_per_gpu - fp8.weights_bytes_per_gpu == linear_bf16 // 2
    assert fp8.kv_bytes(1) == bf16.kv_bytes(1)  # KV stays BF16
    # Long prefill is compute-bound: A100 has no FP8 tensor cores, so the GEMMs cost the same...
    assert fp8.prefill_breakdown(8192)["linear"] == pytest.approx(
        bf16.prefill_breakdown(8192)["linear"])
    # ...while decode streams half the linear weights.
    assert fp8.decode_breakdown(1, 0)["linear"] < 0.6 * bf16.decode_breakdown(1, 0)["linear"]
    h100_bf16 = LatencyModel("llama-3.1-70b", "h100", 4)
    h100_fp8 = LatencyModel("llama-3.1-70b", "h100", 4, weight_dtype="fp8")
    assert h100_fp8.prefill_breakdown(8192)["linear"] < 0.7 * h100_bf16.prefill_breakdown(
        8192)["linear"]


def test_efficiency_constants_come_from_the_gpu_spec():
    gpu = load_gpu("h100")
    slow = replace(gpu, efficiency=replace(gpu.efficiency, mbu=0.4, decode_overhead_ms=0.0,
                                           overhead_per_log2_tp_ms=0.0))
    fast = replace(gpu, efficiency=replace(gpu.efficiency, decode_overhead_ms=0.0,
                                           overhead_per_log2_tp_ms=0.0))
    ratio = (LatencyModel("llama-3.1-8b", slow, 1).decode_step_time(1, 0)
             / LatencyModel("llama-3.1-8b", fast, 1).decode_step_time(1, 0))
    assert ratio == pytest.approx(2.0)


def test_decode_overhead_grows_with_tp():
    overheads = [LatencyModel("llama-3.1-70b", "h200", tp).decode_breakdown(1, 0)["overhead"]
                 for tp in (4, 8)]
    assert overheads == pytest.approx([3.5e-3, 4.5e-3])  # 1.5 ms + 1.0 ms * log2(tp)


def test_names_are_case_insensitive_and_canonical():
    lm = LatencyModel("LLAMA-3.1-70B", "H100", 4, weight_dtype="BF16")
    assert (lm.model.name, lm.gpu.name, lm.tp, lm.weight_dtype) == ("llama-3.1-70b", "h100", 4,
                                                                    "bf16")
    assert lm.prefill_time(1000) == LatencyModel("llama-3.1-70b", "h100", 4).prefill_time(1000)
    assert LatencyModel(load_model("Qwen3-30B-A3B"), load_gpu("B200"), 1).model.is_moe


def test_unknown_names_suggest():
    with pytest.raises(ConfigError, match=r"unknown gpu 'h1000'.*a100.*Did you mean: `h100`"):
        LatencyModel("llama-3.1-70b", "h1000", 4)
    with pytest.raises(ConfigError, match=r"unknown model.*Did you mean: `llama-3.1-70b`"):
        LatencyModel("llama-3.1-70", "h100", 4)


@pytest.mark.parametrize("tp", [0, 3, 16, -4, 2.0, True])
def test_bad_tp_is_rejected(tp):
    with pytest.raises(ConfigError, match="tp"):
        LatencyModel("llama-3.1-70b", "h100", tp)


def test_bad_dtype_and_utilization_are_rejected():
    with pytest.raises(ConfigError, match="weight_dtype"):
        LatencyModel("llama-3.1-70b", "h100", 4, weight_dtype="int4")
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        LatencyModel("llama-3.1-70b", "h100", 4, gpu_memory_utilization=1.5)


def test_model_that_does_not_fit_says_what_it_needs():
    with pytest.raises(ConfigError) as info:
        LatencyModel("llama-3.1-70b", "a100", 2)
    msg = str(info.value)
    # 65.7 GiB weights + 4 reserved + 20 GiB KV for one 131072-token request vs 0.9 x 80 GiB.
    assert "needs 89.7 GiB per GPU" in msg and "has 72.0 GiB" in msg
    assert "TP degrees that fit on a100 in bf16: 4, 8" in msg
    assert "`weight_dtype: fp8` would fit at tp=2" in msg
    with pytest.raises(ConfigError, match="No TP degree of 1, 2, 4, 8 fits on l40s in bf16"):
        LatencyModel("qwen3-235b-a22b", "l40s", 8)


def test_min_kv_tokens_sets_the_fit_threshold():
    # Qwen3-235B on H200 TP4 holds ~0.29 M tokens: asking for more than that must fail.
    lm = LatencyModel("qwen3-235b-a22b", "h200", 4)
    LatencyModel("qwen3-235b-a22b", "h200", 4, min_kv_tokens=lm.kv_capacity_tokens())
    with pytest.raises(ConfigError, match="needs"):
        LatencyModel("qwen3-235b-a22b", "h200", 4, min_kv_tokens=lm.kv_capacity_tokens() + 1)


def test_every_shipped_gpu_and_model_builds():
    for gpu in known_names("gpus"):
        for model in known_names("models"):
            tp = 8 if "235b" in model or "70b" in model else 2
            dtype = "fp8" if (gpu, model) == ("l40s", "qwen3-235b-a22b") else "bf16"
            lm = LatencyModel(model, gpu, tp, weight_dtype=dtype)
            assert lm.kv_capacity_tokens() > lm.model.max_position_embeddings
            for value in (lm.prefill_time(1000), lm.decode_step_time(8, 8000)):
                assert math.isfinite(value) and 0 < value < 10


def test_calibration_within_tolerance():
    checked = 0
    for result in calibration_table():
        if result.point.floor:
            assert result.error > 0, result.point.point  # never faster than 100 % of peak
        elif result.point.tolerance is not None:
            assert abs(result.error) <= result.point.tolerance, (result.point.point, result.error)
            checked += 1
        elif "2023 vLLM" in result.point.note:
            # The 2023 engine was slower than the modern stack the model targets.
            assert result.error < 0, result.point.point
    assert checked >= 15 and len(CALIBRATION_POINTS) > checked
