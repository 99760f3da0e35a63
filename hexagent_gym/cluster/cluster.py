"""A P-D disaggregated cluster: prefill and decode instance pools plus the network between them.

``load_cluster("hetero-1")`` reads ``configs/clusters/hetero-1.yaml`` (schema: docs/latency.md,
"Cluster configs", and the comment at the top of that file), expands every pool entry into
``count`` instances, builds one shared ``LatencyModel`` per (GPU, TP) and precomputes the KV
transfer time of every (prefill, decode) pair as ``setup + tokens * seconds_per_token``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from hexagent_gym.cluster.hardware import GpuSpec, ModelSpec, check_keys, load_gpu, load_model
from hexagent_gym.cluster.latency import WEIGHT_DTYPES, LatencyModel
from hexagent_gym.config import ConfigError, field, known_names, load_named, suggest

DEFAULT_MAX_BATCH_SIZE = 256
"""Decode instances batch at most this many sequences unless the pool entry sets max_batch_size."""
DEFAULT_SETUP_MS = 1.0
"""Per-transfer fixed latency: connector handshake, descriptor submission and RDMA setup (ms)."""
DEFAULT_NETWORK_EFFICIENCY = 0.8
"""Share of the NICs' line rate a KV transfer achieves (InferSim, aiconfigurator use 0.8)."""

_CLUSTER_FIELDS = ("name", "description", "model", "weight_dtype", "gpu_memory_utilization",
                   "max_model_len",
                   "prefill", "decode", "network")
_POOL_FIELDS = ("gpu", "tp", "count", "max_batch_size")
_NETWORK_FIELDS = ("setup_ms", "efficiency", "same_class_gbs", "cross_class_gbs", "matrix")


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """One serving instance (a model replica on ``tp`` GPUs of one type)."""

    role: str
    """``"prefill"`` or ``"decode"``."""
    index: int
    """Position in its pool (0-based, in listing order)."""
    gpu: str
    """Canonical lower-case GPU name, e.g. ``"h100"``."""
    tp: int
    latency: LatencyModel
    """Step-time model; one object is shared by all instances with the same GPU and TP."""
    kv_capacity_tokens: int
    """Tokens of KV cache the instance holds."""
    max_batch_size: int
    """Sequences batched per decode step; 1 for prefill instances (one call at a time)."""


@dataclass(frozen=True, slots=True)
class NetworkSpec:
    """KV-transfer network between prefill and decode instances.

    Effective bandwidth of a pair, in order of precedence: ``matrix[p_gpu][d_gpu]`` (or
    ``matrix[d_gpu][p_gpu]`` when only that direction is given); ``same_class_gbs`` /
    ``cross_class_gbs`` by whether both GPUs are of one type; otherwise
    ``efficiency * min(tp_p * nic_p, tp_d * nic_d)`` from the GPUs' per-GPU NIC bandwidths.
    Overrides are effective GB/s per instance pair (``efficiency`` is not applied to them).
    """

    setup_ms: float = DEFAULT_SETUP_MS
    """Fixed latency per transfer, ms."""
    efficiency: float = DEFAULT_NETWORK_EFFICIENCY
    """Share of the NICs' line rate a transfer achieves (the default bandwidth only)."""
    same_class_gbs: float | None = None
    cross_class_gbs: float | None = None
    matrix: Mapping[str, Mapping[str, float]] | None = None

    def bandwidth_gbs(self, p: GpuSpec, p_tp: int, d: GpuSpec, d_tp: int) -> float:
        """Effective GB/s from a prefill instance (``p_tp`` x ``p``) to a decode instance."""
        if self.matrix is not None:
            row = self.matrix.get(p.name, {})
            return row[d.name] if d.name in row else self.matrix[d.name][p.name]
        override = self.same_class_gbs if p.name == d.name else self.cross_class_gbs
        if override is not None:
            return override
        return self.efficiency * min(p_tp * p.nic_gbs, d_tp * d.nic_gbs)


@dataclass(frozen=True, slots=True, eq=False)
class ClusterSpec:
    """A loaded cluster: model, expanded instance pools, network and transfer-time tables."""

    name: str
    model: ModelSpec
    source: str
    """File the cluster came from (``"<dict>"`` when built from a mapping)."""
    weight_dtype: str
    prefill: tuple[InstanceSpec, ...]
    decode: tuple[InstanceSpec, ...]
    network: NetworkSpec
    transfer_setup_s: np.ndarray
    """(P, D) float64: fixed seconds per KV transfer from prefill p to decode d (read-only)."""
    transfer_s_per_token: np.ndarray
    """(P, D) float64: seconds per transferred token, so transfer = setup + tokens * this."""
    transfer_bandwidth_gbs: np.ndarray
    """(P, D) float64: effective GB/s of each pair (for reporting)."""

    def transfer_time(self, p: int, d: int, tokens: int) -> float:
        """Seconds to move the KV of ``tokens`` tokens from prefill ``p`` to decode ``d``."""
        return float(self.transfer_setup_s[p, d] + tokens * self.transfer_s_per_token[p, d])

    @property
    def max_decode_kv_tokens(self) -> int:
        """The largest KV capacity among decode instances (no request longer than it can run)."""
        return max(inst.kv_capacity_tokens for inst in self.decode)


def load_cluster(spec: str | Path | Mapping[str, Any]) -> ClusterSpec:
    """Load a cluster by shipped name (case-insensitive), YAML path, or an already-parsed mapping.

    Raises:
        ConfigError: naming the file and field: unknown GPU or model (with suggestions), bad TP,
            count < 1, empty pool, missing or unknown fields, an incomplete network matrix, or a
            model that does not fit its GPUs.
    """
    if isinstance(spec, Mapping):
        data, source, default_name = dict(spec), "<dict>", "custom"
    elif isinstance(spec, str) and spec in _REGISTERED:  # a generated cluster, by its name
        data, source, default_name = dict(_REGISTERED[spec]), f"<generated {spec}>", spec
    else:
        data, source = load_named("clusters", spec)
        default_name = Path(source).stem
    check_keys(data, _CLUSTER_FIELDS, source)
    name = field(data, "name", source, str, default=default_name)
    model_name = field(data, "model", source, str)
    try:
        model = load_model(model_name)
    except ConfigError as exc:
        raise ConfigError(f"{source}: field 'model': {exc}") from None
    weight_dtype = field(data, "weight_dtype", source, str, default="bf16").strip().lower()
    if weight_dtype not in WEIGHT_DTYPES:
        raise ConfigError(f"{source}: field 'weight_dtype' must be one of "
                          f"{', '.join(WEIGHT_DTYPES)}, got {weight_dtype!r}")
    util = field(data, "gpu_memory_utilization", source, float, default=None)
    if util is not None and not 0 < util <= 1:
        raise ConfigError(f"{source}: field 'gpu_memory_utilization' must be in (0, 1], "
                          f"got {util}")

    max_len = field(data, "max_model_len", source, int, default=None)
    if max_len is not None and max_len < 1:
        raise ConfigError(f"{source}: field 'max_model_len' must be a positive number of tokens "
                          f"(the longest request an instance must hold), got {max_len}")

    gpus: dict[str, GpuSpec] = {}
    latencies: dict[tuple[str, int], LatencyModel] = {}
    pools = {}
    for role in ("prefill", "decode"):
        pools[role] = tuple(_expand_pool(data, role, source, model, weight_dtype, util, gpus,
                                         latencies, max_len))
    network = _parse_network(data.get("network"), source, {i.gpu for i in pools["prefill"]},
                             {i.gpu for i in pools["decode"]})
    by_name = {spec.name: spec for spec in gpus.values()}
    bw = np.array([[network.bandwidth_gbs(by_name[p.gpu], p.tp, by_name[d.gpu], d.tp)
                    for d in pools["decode"]] for p in pools["prefill"]], dtype=np.float64)
    setup = np.full(bw.shape, network.setup_ms * 1e-3, dtype=np.float64)
    per_token = model.kv_bytes_per_token / (bw * 1e9)
    for array in (bw, setup, per_token):
        array.setflags(write=False)
    return ClusterSpec(name=name, model=model, source=source, weight_dtype=weight_dtype,
                       prefill=pools["prefill"], decode=pools["decode"], network=network,
                       transfer_setup_s=setup, transfer_s_per_token=per_token,
                       transfer_bandwidth_gbs=bw)


_REGISTERED: dict[str, Mapping[str, Any]] = {}


def register_cluster(spec: Mapping[str, Any]) -> str:
    """Make a cluster mapping loadable by its ``name`` (``load_cluster(name)``, and so anywhere a
    cluster name is accepted, e.g. an episode's ``cluster``) in this process; returns the name.

    Generated clusters (``hexagent_gym.cluster.cluster_sampling``) are registered this way, so
    episode configs stay hashable and readable. Registering the same mapping twice is a no-op.

    Raises:
        ConfigError: the mapping is not a valid cluster, or its name is a shipped cluster or
            already registered with different content.
    """
    load_cluster(spec)  # validate before anything is registered
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a registered cluster needs a non-empty string 'name', got {name!r}")
    if name.lower() in known_names("clusters"):
        raise ConfigError(f"cannot register cluster '{name}': a shipped cluster has that name")
    old = _REGISTERED.get(name)
    if old is not None and dict(old) != dict(spec):
        raise ConfigError(f"cluster '{name}' is already registered with different content")
    _REGISTERED[name] = dict(spec)
    return name


def _expand_pool(data: Mapping[str, Any], role: str, source: str, model: ModelSpec,
                 weight_dtype: str, util: float | None, gpus: dict[str, GpuSpec],
                 latencies: dict[tuple[str, int], LatencyModel],
                 max_len: int | None = None) -> list[InstanceSpec]:
    entries = field(data, role, source, list)
    if not entries:
        raise ConfigError(f"{source}: field '{role}' is an empty pool; list at least one "
                          f"{{gpu, tp, count}} entry")
    instances: list[InstanceSpec] = []
    for i, entry in enumerate(entries):
        where = f"{source}: {role}[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where}: expected a mapping like {{gpu: h100, tp: 4, count: 2}}, "
                              f"got {entry!r}")
        check_keys(entry, _POOL_FIELDS, where)
        gpu_key = field(entry, "gpu", where, str)
        if gpu_key not in gpus:
            try:
                spec = load_gpu(gpu_key)
            except ConfigError as exc:
                raise ConfigError(f"{where}: field 'gpu': {exc}") from None
            for other in gpus.values():
                if other.name == spec.name and replace(other, source="") != replace(spec,
                                                                                    source=""):
                    raise ConfigError(f"{where}: field 'gpu': '{gpu_key}' and '{other.source}' "
                                      f"are different GPU specs both named '{spec.name}'")
            gpus[gpu_key] = spec
        gpu = gpus[gpu_key]
        tp = field(entry, "tp", where, int)
        count = field(entry, "count", where, int, default=1)
        if count < 1:
            raise ConfigError(f"{where}: field 'count' must be >= 1, got {count}")
        if role == "prefill":
            if "max_batch_size" in entry:
                raise ConfigError(f"{where}: field 'max_batch_size' applies to decode pools only; "
                                  f"a prefill instance serves one call at a time")
            max_batch = 1
        else:
            max_batch = field(entry, "max_batch_size", where, int, default=DEFAULT_MAX_BATCH_SIZE,
                              positive=True)
        key = (gpu.name, tp)
        if key not in latencies:
            try:
                latencies[key] = LatencyModel(model, gpu, tp, weight_dtype=weight_dtype,
                                              gpu_memory_utilization=util,
                                              min_kv_tokens=max_len)
            except ConfigError as exc:
                raise ConfigError(f"{where} (gpu {gpu.name}, tp {tp}): {exc}") from None
        latency = latencies[key]
        for _ in range(count):
            instances.append(InstanceSpec(role=role, index=len(instances), gpu=gpu.name, tp=tp,
                                          latency=latency,
                                          kv_capacity_tokens=latency.kv_capacity_tokens(),
                                          max_batch_size=max_batch))
    return instances


def _parse_network(raw: Any, source: str, prefill_gpus: set[str],
                   decode_gpus: set[str]) -> NetworkSpec:
    where = f"{source}: network"
    if raw is None:
        return NetworkSpec()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {raw!r}")
    check_keys(raw, _NETWORK_FIELDS, where)
    setup_ms = field(raw, "setup_ms", where, float, default=DEFAULT_SETUP_MS)
    if setup_ms < 0:
        raise ConfigError(f"{where}: field 'setup_ms' must be >= 0, got {setup_ms}")
    efficiency = field(raw, "efficiency", where, float, default=DEFAULT_NETWORK_EFFICIENCY,
                       positive=True)
    if efficiency > 1:
        raise ConfigError(f"{where}: field 'efficiency' must be in (0, 1], got {efficiency}")
    same = field(raw, "same_class_gbs", where, float, default=None, positive=True)
    cross = field(raw, "cross_class_gbs", where, float, default=None, positive=True)
    matrix = None
    if "matrix" in raw:
        if same is not None or cross is not None:
            raise ConfigError(f"{where}: give either 'matrix' or 'same_class_gbs'/"
                              f"'cross_class_gbs', not both")
        matrix = _parse_matrix(field(raw, "matrix", where, dict), f"{where}.matrix",
                               prefill_gpus, decode_gpus)
    return NetworkSpec(setup_ms=setup_ms, efficiency=efficiency, same_class_gbs=same,
                       cross_class_gbs=cross, matrix=matrix)


def _parse_matrix(raw: Mapping[str, Any], where: str, prefill_gpus: set[str],
                  decode_gpus: set[str]) -> dict[str, dict[str, float]]:
    """Validate a GPU-class bandwidth matrix; every (prefill class, decode class) pair of the
    cluster needs a value in one direction or the other."""
    present = prefill_gpus | decode_gpus
    gpu_names = known_names("gpus")
    matrix: dict[str, dict[str, float]] = {}
    for row_key, row in raw.items():
        row_name = str(row_key).strip().lower()
        if not isinstance(row, Mapping):
            raise ConfigError(f"{where}: row '{row_key}' must map GPU names to GB/s, got {row!r}")
        matrix[row_name] = {}
        for col_key in row:
            col_name = str(col_key).strip().lower()
            for name in (row_name, col_name):
                if name not in present and name not in gpu_names:
                    raise ConfigError(f"{where}: unknown GPU class '{name}'; known: "
                                      f"{', '.join(sorted(present))}.{suggest(name, gpu_names)}")
            matrix[row_name][col_name] = field(row, col_key, f"{where}.{row_name}", float,
                                               positive=True)
    missing = [f"{a}->{b}" for a in sorted(prefill_gpus) for b in sorted(decode_gpus)
               if b not in matrix.get(a, {}) and a not in matrix.get(b, {})]
    if missing:
        raise ConfigError(f"{where}: incomplete; no bandwidth for GPU class pair(s) "
                          f"{', '.join(missing)} (give matrix[a][b] or matrix[b][a] in GB/s)")
    return matrix
