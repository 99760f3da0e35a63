"""Cluster configs: expansion, shared latency models, KV transfer times, and every error case."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from hexagent_gym.cluster.cluster import ClusterSpec, InstanceSpec, load_cluster
from hexagent_gym.cluster.latency import LatencyModel
from hexagent_gym.config import ConfigError, known_names

LLAMA70_KV = 327_680


def tiny(**overrides) -> dict:
    """A small valid cluster mapping; keyword arguments replace top-level fields."""
    data = {
        "name": "t",
        "model": "llama-3.1-8b",
        "prefill": [{"gpu": "a100", "tp": 1}, {"gpu": "h100", "tp": 1}],
        "decode": [{"gpu": "a100", "tp": 1}, {"gpu": "h100", "tp": 2, "count": 2}],
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize("name", known_names("clusters"))
def test_every_shipped_cluster_loads(name):
    cluster = load_cluster(name)
    assert isinstance(cluster, ClusterSpec) and cluster.name == name
    assert cluster.source.endswith(f"{name}.yaml")
    shape = (len(cluster.prefill), len(cluster.decode))
    assert cluster.transfer_setup_s.shape == cluster.transfer_s_per_token.shape == shape
    for pool, role in ((cluster.prefill, "prefill"), (cluster.decode, "decode")):
        assert [i.index for i in pool] == list(range(len(pool)))
        assert all(isinstance(i, InstanceSpec) and i.role == role for i in pool)
        assert all(i.kv_capacity_tokens == i.latency.kv_capacity_tokens() > 0 for i in pool)


@pytest.mark.parametrize(("name", "model", "per_pool"), [
    ("hetero-1", "llama-3.1-70b", {"a100": 2, "h100": 3, "h200": 3}),
    ("hetero-2", "llama-3.1-70b", {"a100": 3, "h100": 4, "h200": 3}),
    ("homo-h200-4p4d", "llama-3.1-70b", {"h200": 4}),
    ("qwen-hetero-1", "qwen3-235b-a22b", {"a100": 2, "h100": 3, "h200": 3}),
    ("qwen-hetero-2", "qwen3-235b-a22b", {"a100": 3, "h100": 4, "h200": 3}),
    ("homo-a100-4p4d", "qwen3-235b-a22b", {"a100": 4}),
])
def test_paper_setups(name, model, per_pool):
    cluster = load_cluster(name)
    assert cluster.model.name == model and cluster.weight_dtype == "bf16"
    for pool in (cluster.prefill, cluster.decode):
        assert {g: sum(i.gpu == g for i in pool) for g in per_pool} == per_pool
        assert len(pool) == sum(per_pool.values())
        for inst in pool:
            expected_tp = 4 if model == "llama-3.1-70b" or inst.gpu == "h200" else 8
            assert inst.tp == expected_tp


def test_hetero1_expansion_order_and_shared_latency_models():
    cluster = load_cluster("HeTeRo-1")  # case-insensitive
    assert [i.gpu for i in cluster.prefill] == ["a100"] * 2 + ["h100"] * 3 + ["h200"] * 3
    assert all(i.max_batch_size == 1 for i in cluster.prefill)
    assert all(i.max_batch_size == 256 for i in cluster.decode)
    p, d = cluster.prefill, cluster.decode
    assert p[0].latency is p[1].latency is d[0].latency is d[1].latency
    assert p[2].latency is d[4].latency and p[2].latency is not p[5].latency
    assert cluster.max_decode_kv_tokens == d[-1].kv_capacity_tokens == max(
        i.kv_capacity_tokens for i in d)
    assert d[-1].kv_capacity_tokens > 2 * d[0].kv_capacity_tokens  # H200's 141 GB


def test_transfer_time_hand_computed():
    cluster = load_cluster("hetero-1")
    # A100 TP4 -> H200 TP4: 0.8 x min(4 x 25, 4 x 50) = 80 GB/s; setup 1 ms.
    expected = 1e-3 + 2048 * LLAMA70_KV / 80e9
    assert cluster.transfer_time(0, 7, 2048) == pytest.approx(expected, rel=1e-12)
    # H100 TP4 -> H200 TP4: 0.8 x 200 = 160 GB/s.
    assert cluster.transfer_time(3, 6, 1000) == pytest.approx(1e-3 + 1000 * LLAMA70_KV / 160e9)
    assert np.all(cluster.transfer_setup_s == 1e-3)
    tokens = 3000
    vectorised = cluster.transfer_setup_s + tokens * cluster.transfer_s_per_token
    scalar = [[cluster.transfer_time(i, j, tokens) for j in range(8)] for i in range(8)]
    np.testing.assert_allclose(vectorised, scalar, rtol=1e-12)
    assert not cluster.transfer_s_per_token.flags.writeable


def test_qwen_tp8_to_tp4_transfer_uses_the_smaller_side():
    cluster = load_cluster("qwen-hetero-1")
    # A100 TP8 (8 x 25 = 200) -> H200 TP4 (4 x 50 = 200): 0.8 x 200 = 160 GB/s; logical KV bytes.
    assert cluster.transfer_s_per_token[0, 7] == pytest.approx(192_512 / 160e9)


def test_network_class_overrides_and_setup():
    network = {"setup_ms": 2.5, "same_class_gbs": 100, "cross_class_gbs": 10}
    cluster = load_cluster(tiny(network=network))
    kvb = cluster.model.kv_bytes_per_token
    assert cluster.transfer_time(0, 0, 100) == pytest.approx(2.5e-3 + 100 * kvb / 100e9)
    assert cluster.transfer_time(0, 1, 100) == pytest.approx(2.5e-3 + 100 * kvb / 10e9)
    only_cross = load_cluster(tiny(network={"cross_class_gbs": 10, "efficiency": 0.5}))
    # Same class falls back to the NIC default: 0.5 x min(1 x 25, 1 x 25) and 0.5 x min(50, 2 x 50).
    np.testing.assert_allclose(only_cross.transfer_bandwidth_gbs, [[12.5, 10, 10], [10, 25, 25]])


def test_network_matrix_with_reverse_direction_fallback():
    matrix = {"A100": {"a100": 30, "H100": 40}, "h100": {"h100": 90}}
    cluster = load_cluster(tiny(network={"matrix": matrix}))
    bw = cluster.transfer_bandwidth_gbs
    # decode: [a100, h100, h100]; prefill: [a100, h100]; h100 -> a100 falls back to a100 -> h100.
    np.testing.assert_allclose(bw, [[30, 40, 40], [40, 90, 90]])


def test_default_bandwidth_uses_each_side_nic():
    cluster = load_cluster(tiny())
    # prefill a100 TP1 (25) -> decode h100 TP2 (100): 0.8 x 25 = 20 GB/s.
    assert cluster.transfer_bandwidth_gbs[0, 1] == pytest.approx(20)
    # prefill h100 TP1 (50) -> decode h100 TP2 (100): 0.8 x 50 = 40 GB/s.
    assert cluster.transfer_bandwidth_gbs[1, 2] == pytest.approx(40)


def test_asymmetric_pools_and_every_gpu():
    gpus = known_names("gpus")
    data = tiny(prefill=[{"gpu": g.upper(), "tp": 1} for g in gpus],
                decode=[{"gpu": "h200", "tp": 1, "max_batch_size": 32}])
    cluster = load_cluster(data)
    assert [i.gpu for i in cluster.prefill] == gpus
    assert len(cluster.decode) == 1 and cluster.decode[0].max_batch_size == 32
    assert cluster.transfer_setup_s.shape == (len(gpus), 1)
    assert cluster.source == "<dict>" and cluster.name == "t"


def test_fp8_and_memory_utilization_options():
    base = load_cluster(tiny())
    fp8 = load_cluster(tiny(weight_dtype="FP8"))
    assert fp8.weight_dtype == "fp8"
    assert fp8.decode[0].kv_capacity_tokens > base.decode[0].kv_capacity_tokens
    low = load_cluster(tiny(gpu_memory_utilization=0.5))
    assert low.decode[0].latency.gpu_memory_utilization == 0.5
    assert low.decode[0].kv_capacity_tokens < base.decode[0].kv_capacity_tokens


def test_fp8_option_lets_a_non_fitting_setup_load():
    data = tiny(model="llama-3.1-70b", prefill=[{"gpu": "a100", "tp": 2}],
                decode=[{"gpu": "a100", "tp": 4}])
    with pytest.raises(ConfigError, match=r"prefill\[0\].*needs .* GiB per GPU.*has 72.0 GiB"):
        load_cluster(data)
    data["weight_dtype"] = "fp8"
    assert load_cluster(data).prefill[0].tp == 2


@pytest.mark.parametrize(("change", "pattern"), [
    ({"model": "llama-3-70b"}, r"field 'model'.*unknown model.*Did you mean"),
    ({"model": None}, r"field 'model' must be str"),
    ({"prefill": [{"gpu": "h10", "tp": 1}]}, r"prefill\[0\]: field 'gpu'.*unknown gpu 'h10'"),
    ({"prefill": [{"tp": 1}]}, r"prefill\[0\]: missing required field 'gpu'"),
    ({"decode": [{"gpu": "a100"}]}, r"decode\[0\]: missing required field 'tp'"),
    ({"decode": [{"gpu": "a100", "tp": 3}]}, r"decode\[0\].*tp must be one of 1, 2, 4, 8"),
    ({"decode": [{"gpu": "a100", "tp": 16}]}, r"decode\[0\].*tp must be"),
    ({"decode": [{"gpu": "a100", "tp": "4"}]}, r"decode\[0\]: field 'tp' must be int"),
    ({"model": "qwen3-30b-a3b", "decode": [{"gpu": "b200", "tp": 8}],
      "prefill": [{"gpu": "b200", "tp": 8}]}, None),
    ({"decode": [{"gpu": "a100", "tp": 1, "count": 0}]},
     r"decode\[0\]: field 'count' must be >= 1"),
    ({"decode": []}, r"field 'decode' is an empty pool"),
    ({"prefill": {"gpu": "a100"}}, r"field 'prefill' must be list"),
    ({"prefill": ["a100"]}, r"prefill\[0\]: expected a mapping"),
    ({"prefill": [{"gpu": "a100", "tp": 1, "cnt": 2}]}, r"unknown field 'cnt'.*Did you mean"),
    ({"prefill": [{"gpu": "a100", "tp": 1, "max_batch_size": 8}]},
     r"'max_batch_size' applies to decode pools only"),
    ({"decode": [{"gpu": "a100", "tp": 1, "max_batch_size": 0}]},
     r"field 'max_batch_size' must be > 0"),
    ({"modle": "x"}, r"unknown field 'modle'.*Did you mean: `model`"),
    ({"weight_dtype": "int4"}, r"field 'weight_dtype' must be one of bf16, fp8"),
    ({"gpu_memory_utilization": 0}, r"field 'gpu_memory_utilization' must be in \(0, 1\]"),
    ({"network": {"efficiency": 1.5}}, r"network: field 'efficiency' must be in \(0, 1\]"),
    ({"network": {"setup_ms": -1}}, r"network: field 'setup_ms' must be >= 0"),
    ({"network": {"bandwidth": 5}}, r"network: unknown field 'bandwidth'"),
    ({"network": {"matrix": {"a100": {"a100": 10}}}},
     r"network.matrix: incomplete.*a100->h100.*h100->a100.*h100->h100"),
    ({"network": {"matrix": {"a100": {"a100": 1, "h100": 1, "h10": 1}, "h100": {"h100": 1}}}},
     r"network.matrix: unknown GPU class 'h10'.*Did you mean: `h100`"),
    ({"network": {"matrix": {"a100": {"a100": 0, "h100": 1}, "h100": {"h100": 1}}}},
     r"network.matrix.a100: field 'a100' must be > 0"),
    ({"network": {"matrix": {"a100": 5}}}, r"network.matrix: row 'a100' must map"),
    ({"network": {"matrix": {}, "same_class_gbs": 5}}, r"either 'matrix' or 'same_class_gbs'"),
])
def test_bad_config_raises_config_error(change, pattern):
    data = tiny(**change)
    if pattern is None:  # a valid variation, as a control
        assert load_cluster(data).decode[0].tp == 8
        return
    with pytest.raises(ConfigError, match=pattern) as info:
        load_cluster(data)
    assert str(info.value).startswith("<dict>")


def test_missing_model_field():
    data = tiny()
    del data["model"]
    with pytest.raises(ConfigError, match="<dict>: missing required field 'model'"):
        load_cluster(data)


def test_errors_name_the_file(tmp_path: Path):
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(tiny(decode=[{"gpu": "a100", "tp": 1, "count": -1}])))
    with pytest.raises(ConfigError, match=rf"{path}: decode\[0\]: field 'count'"):
        load_cluster(path)
    path.write_text(yaml.safe_dump({k: v for k, v in tiny().items() if k != "name"}))
    assert load_cluster(str(path)).name == "mine"  # defaults to the file stem


def test_unknown_cluster_name_suggests():
    with pytest.raises(ConfigError, match=r"unknown cluster 'hetero1'.*Did you mean: `hetero-1`"):
        load_cluster("hetero1")


def test_latency_models_are_per_gpu_and_tp():
    cluster = load_cluster(tiny())
    lat = {(i.gpu, i.tp): i.latency for i in (*cluster.prefill, *cluster.decode)}
    assert len({id(v) for v in lat.values()}) == 3
    assert isinstance(lat[("h100", 2)], LatencyModel) and lat[("h100", 2)].tp == 2


def test_gpu_given_by_path_and_a_clash_of_names(tmp_path: Path):
    h100 = yaml.safe_load((Path(load_cluster("tiny-2p2d").decode[1].latency.gpu.source))
                          .read_text())
    same = tmp_path / "my-h100.yaml"
    same.write_text(yaml.safe_dump(h100))
    cluster = load_cluster(tiny(decode=[{"gpu": str(same), "tp": 1}, {"gpu": "h100", "tp": 1}]))
    assert [i.gpu for i in cluster.decode] == ["h100", "h100"]
    assert cluster.decode[0].latency is cluster.decode[1].latency
    h100["efficiency"]["mbu"] = 0.5
    same.write_text(yaml.safe_dump(h100))
    with pytest.raises(ConfigError, match="different GPU specs both named 'h100'"):
        load_cluster(tiny(decode=[{"gpu": "h100", "tp": 1}, {"gpu": str(same), "tp": 1}]))
