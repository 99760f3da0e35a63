"""Random clusters for training on a distribution: GPU mixes, sizes and P:D ratios.

:class:`ClusterDistribution` draws a cluster mapping (the schema of ``configs/clusters``) from a
generator: a prefill count and a decode count, each uniform in its range, and a GPU type per
instance, uniform over ``gpus``; instances of one GPU type form one pool entry. The mapping is
named after its content (``gen-3p5d-1a2b3c``), so the same draw always gets the same name, and
:func:`sample_clusters` registers it (:func:`hexagent_gym.cluster.cluster.register_cluster`) so that
episode configs refer to it by name like any shipped cluster.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hexagent_gym.cluster.cluster import register_cluster
from hexagent_gym.cluster.hardware import check_keys
from hexagent_gym.config import ConfigError, known_names

_FIELDS = ("model", "tp", "gpus", "prefill", "decode", "network")


@dataclass(frozen=True)
class ClusterDistribution:
    """How random clusters are drawn.

    Attributes:
        model: shipped model name every instance serves.
        tp: tensor-parallel degree of every instance.
        gpus: GPU types an instance is drawn from (uniformly, independently per instance).
        prefill: inclusive (lowest, highest) prefill instance count.
        decode: inclusive (lowest, highest) decode instance count.
        network: the clusters' ``network`` mapping (None: the schema's defaults).
    """

    model: str = "llama-3.1-70b"
    tp: int = 4
    gpus: tuple[str, ...] = ("a100", "h100", "h200")
    prefill: tuple[int, int] = (3, 6)
    decode: tuple[int, int] = (3, 6)
    network: Mapping[str, Any] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        src = "cluster distribution"
        if self.model not in known_names("models"):
            raise ConfigError(f"{src}: unknown model {self.model!r}; known: "
                              f"{', '.join(known_names('models'))}")
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            raise ConfigError(f"{src}: tp must be an integer >= 1, got {self.tp!r}")
        gpus = tuple(self.gpus) if isinstance(self.gpus, list | tuple) else None
        if not gpus or any(g not in known_names("gpus") for g in gpus):
            raise ConfigError(f"{src}: gpus must be a non-empty list of shipped GPU names "
                              f"({', '.join(known_names('gpus'))}), got {self.gpus!r}")
        object.__setattr__(self, "gpus", gpus)
        for role in ("prefill", "decode"):
            rng = getattr(self, role)
            ok = (isinstance(rng, list | tuple) and len(rng) == 2
                  and all(isinstance(v, int) and not isinstance(v, bool) for v in rng)
                  and 1 <= rng[0] <= rng[1])
            if not ok:
                raise ConfigError(f"{src}: {role} must be [lowest, highest] instance counts "
                                  f"with 1 <= lowest <= highest, got {rng!r}")
            object.__setattr__(self, role, (int(rng[0]), int(rng[1])))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str) -> ClusterDistribution:
        """Build from a config mapping; unknown keys and bad values name ``source``."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: expected a mapping, got {type(data).__name__}")
        check_keys(data, _FIELDS, source)
        try:
            return cls(**data)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None

    def sample(self, rng: np.random.Generator) -> dict[str, Any]:
        """One cluster mapping (validated when registered or loaded)."""
        pools = {}
        for role, (lo, hi) in (("prefill", self.prefill), ("decode", self.decode)):
            n = int(rng.integers(lo, hi + 1))
            picks = rng.integers(len(self.gpus), size=n)
            counts = np.bincount(picks, minlength=len(self.gpus))
            pools[role] = [{"gpu": g, "tp": self.tp, "count": int(c)}
                           for g, c in zip(self.gpus, counts, strict=True) if c]
        body: dict[str, Any] = {"model": self.model, **pools}
        if self.network is not None:
            body["network"] = dict(self.network)
        digest = hashlib.sha1(json.dumps(body, sort_keys=True).encode()).hexdigest()[:6]
        n_p = sum(e["count"] for e in pools["prefill"])
        n_d = sum(e["count"] for e in pools["decode"])
        return {"name": f"gen-{n_p}p{n_d}d-{digest}", **body}


def sample_clusters(dist: ClusterDistribution, count: int, seed: int) -> list[str]:
    """Draw ``count`` clusters from ``dist`` with generator ``seed``, register them and return
    their names (in draw order; a repeated draw appears again under its same name)."""
    rng = np.random.default_rng(seed)
    return [register_cluster(dist.sample(rng)) for _ in range(count)]


__all__ = ["ClusterDistribution", "sample_clusters"]
