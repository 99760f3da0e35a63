"""Scheduler-visible output-length predictors.

A scheduler never knows a call's true output length ``L``; it sees an estimate ``L_hat`` from a
predictor. The simulator makes one predictor per episode (:func:`make_predictor`) and, after
drawing its other randomness, calls ``predict`` once on the true output lengths of every call of
the episode, in workload order, with the episode's generator.

Contract of ``predict(true_outputs, rng)``:

- returns an ``int64`` array of the same shape, every entry ``>= 1``;
- is deterministic given the generator's state;
- ``oracle`` consumes no randomness (episodes with it are bit-identical to ones without a
  predictor); every other predictor draws exactly one vectorised batch per call, so the stream
  after it is predictable: ``lognormal`` draws ``rng.standard_normal(n)`` and ``bucket`` draws
  ``rng.random((n, 2))``, where ``n = true_outputs.size``.

See ``docs/predictors.md`` for what each predictor models and its measured error.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Real
from typing import Any, ClassVar

import numpy as np

from hexagent_gym.config import suggest

DEFAULT_PREDICTOR = "lognormal"
DEFAULT_BUCKET_EDGES = (16, 32, 64, 128, 256, 512, 1024, 2048)
_MAX_ESTIMATE = 2**53  # caps an estimate so an extreme error factor cannot overflow int64


def _lengths(true_outputs: Any) -> np.ndarray:
    """The true lengths as an int64 array; rejects non-integers and lengths below 1."""
    arr = np.asarray(true_outputs)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"true_outputs must be integer token counts, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=True)
    if arr.size and arr.min() < 1:
        raise ValueError(f"true_outputs must all be >= 1, got a minimum of {arr.min()}")
    return arr


def _real(name: str, value: Any, *, low: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low:g}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class OraclePredictor:
    """The true output length: the scheduler knows ``L`` exactly."""

    name: ClassVar[str] = "oracle"

    def predict(self, true_outputs: Any, rng: np.random.Generator | None = None) -> np.ndarray:
        """A copy of ``true_outputs``; ``rng`` is not touched (may be None)."""
        return _lengths(true_outputs)

    def describe(self) -> str:
        return "oracle (true output lengths)"


@dataclass(frozen=True)
class LogNormalPredictor:
    """Multiplicative log-normal error: ``L_hat = max(1, rint(L * exp(bias + sigma * Z)))``.

    ``Z ~ N(0, 1)`` independently per call; ``exp(bias)`` is the median ratio ``L_hat / L``.
    Draws ``rng.standard_normal(n)``.

    Args:
        sigma: spread of the log-ratio (``>= 0``; 0 with bias 0 is the oracle).
        bias: mean of the log-ratio (> 0 over-predicts, < 0 under-predicts).
    """

    name: ClassVar[str] = "lognormal"
    sigma: float = 0.5
    bias: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigma", _real("lognormal: sigma", self.sigma, low=0.0))
        object.__setattr__(self, "bias", _real("lognormal: bias", self.bias))

    def predict(self, true_outputs: Any, rng: np.random.Generator) -> np.ndarray:
        lengths = _lengths(true_outputs)
        z = rng.standard_normal(lengths.shape)
        est = np.rint(lengths * np.exp(self.bias + self.sigma * z))
        return np.clip(est, 1, _MAX_ESTIMATE).astype(np.int64)

    def describe(self) -> str:
        return f"lognormal (sigma={self.sigma:g}, bias={self.bias:g})"


@dataclass(frozen=True)
class BucketPredictor:
    """A proxy classifier over log-spaced length buckets.

    ``edges`` ``e_0 < ... < e_{k-1}`` make ``k + 1`` buckets ``[0, e_0), [e_0, e_1), ...,
    [e_{k-1}, inf)``. The classifier picks a call's true bucket with probability ``accuracy`` and
    otherwise an adjacent one (down or up, equally likely; a step past either end stays in the end
    bucket). ``L_hat`` is the picked bucket's representative length, rounded to the nearest
    integer (``np.rint``) and at least 1: the geometric midpoint ``sqrt(e_{i-1} * e_i)`` for an
    inner bucket, ``e_0 / 2`` for the first, ``2 * e_{k-1}`` for the last. Draws
    ``rng.random((n, 2))``: column 0 decides correct or not, column 1 the direction.

    Args:
        edges: strictly increasing positive bucket edges in tokens.
        accuracy: probability of the true bucket, in ``[0, 1]``.
    """

    name: ClassVar[str] = "bucket"
    edges: tuple[float, ...] = DEFAULT_BUCKET_EDGES
    accuracy: float = 0.7

    def __post_init__(self) -> None:
        object.__setattr__(self, "accuracy", _real("bucket: accuracy", self.accuracy, low=0.0))
        if self.accuracy > 1.0:
            raise ValueError(f"bucket: accuracy must be in [0, 1], got {self.accuracy!r}")
        if isinstance(self.edges, str | bytes) or not hasattr(self.edges, "__iter__"):
            raise ValueError(f"bucket: edges must be a list of numbers, got {self.edges!r}")
        edges = tuple(_real("bucket: edges entry", e) for e in self.edges)
        if not edges:
            raise ValueError("bucket: edges must hold at least one edge")
        if edges[0] <= 0 or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
            raise ValueError(f"bucket: edges must be positive and strictly increasing, got {edges}")
        object.__setattr__(self, "edges", edges)

    def bucket_of(self, lengths: Any) -> np.ndarray:
        """Bucket index of each length (``L < e_0`` is bucket 0, ``L >= e_{k-1}`` bucket ``k``)."""
        return np.searchsorted(np.asarray(self.edges), np.asarray(lengths), side="right")

    def midpoints(self) -> np.ndarray:
        """Each bucket's estimate in tokens (int64, rounded with ``np.rint``, at least 1)."""
        e = np.asarray(self.edges, dtype=float)
        mids = np.concatenate(([e[0] / 2], np.sqrt(e[:-1] * e[1:]), [2 * e[-1]]))
        return np.maximum(np.rint(mids), 1).astype(np.int64)

    def predict(self, true_outputs: Any, rng: np.random.Generator) -> np.ndarray:
        lengths = _lengths(true_outputs)
        u = rng.random((lengths.size, 2))
        true_bucket = self.bucket_of(lengths.ravel())
        step = np.where(u[:, 1] < 0.5, -1, 1) * (u[:, 0] >= self.accuracy)
        picked = np.clip(true_bucket + step, 0, len(self.edges))
        return self.midpoints()[picked].reshape(lengths.shape)

    def describe(self) -> str:
        edges = ",".join(f"{e:g}" for e in self.edges)
        return f"bucket (accuracy={self.accuracy:g}, edges=[{edges}])"


Predictor = OraclePredictor | LogNormalPredictor | BucketPredictor

_REGISTRY: dict[str, type] = {
    cls.name: cls for cls in (OraclePredictor, LogNormalPredictor, BucketPredictor)
}
PREDICTORS: tuple[str, ...] = tuple(_REGISTRY)


def make_predictor(name: str = DEFAULT_PREDICTOR, **params: Any) -> Predictor:
    """Build a registered predictor by name with keyword parameters.

    Raises:
        ValueError: unknown name (lists the known ones), unknown parameter (lists the accepted
            ones), or an invalid parameter value.
    """
    key = str(name).strip().lower()
    cls = _REGISTRY.get(key)
    if cls is None:
        known = list(PREDICTORS)
        raise ValueError(
            f"unknown length predictor {name!r}; known: {', '.join(known)}.{suggest(key, known)}"
        )
    accepted = [f.name for f in dataclasses.fields(cls)]
    for param in params:
        if param not in accepted:
            takes = f"accepted: {', '.join(accepted)}" if accepted else "it takes no parameters"
            raise ValueError(
                f"length predictor {key!r} has no parameter {param!r}; {takes}."
                f"{suggest(param, accepted)}"
            )
    return cls(**params)


def predictor_from_config(name: str, params: Mapping[str, Any] | None = None) -> Predictor:
    """:func:`make_predictor` from the episode-config keys ``length_predictor`` and
    ``length_predictor_params`` (a mapping, or None for the defaults)."""
    if params is not None and not isinstance(params, Mapping):
        raise ValueError(f"length_predictor_params must be a mapping, got {params!r}")
    return make_predictor(name, **dict(params or {}))


def relative_error_summary(true: Any, pred: Any) -> dict[str, float]:
    """Error of estimates ``pred`` against true lengths ``true`` (same shape, ``true >= 1``).

    Returns ``median_abs_rel_err`` and ``mean_abs_rel_err`` of ``|pred - true| / true``,
    ``share_under`` (``pred < true``), ``share_over`` (``pred > true``) and ``n``.
    """
    t = np.asarray(true, dtype=float).ravel()
    p = np.asarray(pred, dtype=float).ravel()
    if t.shape != p.shape:
        raise ValueError(f"true and pred differ in size: {t.size} vs {p.size}")
    if t.size == 0:
        raise ValueError("relative_error_summary needs at least one length")
    if t.min() <= 0:
        raise ValueError("true lengths must be > 0")
    rel = np.abs(p - t) / t
    return {
        "median_abs_rel_err": float(np.median(rel)),
        "mean_abs_rel_err": float(np.mean(rel)),
        "share_under": float(np.mean(p < t)),
        "share_over": float(np.mean(p > t)),
        "n": int(t.size),
    }
