"""One-row LightGBM predictions at C speed, for forecasts asked one workflow at a time.

``Booster.predict`` converts and validates its input and builds a prediction config on every
call: about 25-100 µs for one row, which at one forecast per simulated call was most of the
horizon forecast's cost. LightGBM's C API has a documented fast path for exactly this case
(``LGBM_BoosterPredictForMatSingleRowFastInit`` once per model, then
``LGBM_BoosterPredictForMatSingleRowFast`` per row: about 3 µs). It runs the same trees, so the
predictions are bit-identical to ``Booster.predict(..., raw_score=True)`` (a test holds it).

Inside a running simulation even that path costs 10-13 µs a row: between two forecasts the
simulator's own work evicts the model from the CPU caches, and LightGBM keeps every tree's
nodes in a dozen separately allocated vectors, so one prediction reads about a thousand cold
cache lines. With the compiled kernels built, :func:`flatten_booster` therefore lays the same
trees out once per fit as one contiguous block (a node's split in 32 bytes, each tree's nodes
together), and ``kernels.ensemble_score`` walks it with LightGBM's documented prediction rules
(thresholds, missing-value defaults, categorical bitsets, the sum tree by tree). The block is
checked against LightGBM's own answers when made, and used only where they agree to the bit.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from hexagent_gym.planning import kernels

_RAW_SCORE = 1  # C_API_PREDICT_RAW_SCORE
_FLOAT64 = 1  # C_API_DTYPE_FLOAT64
_NODE = struct.Struct("<dhhBBH")  # threshold; left, right, feature, flags, unused
_BITS = struct.Struct("<iihhBBH")  # a categorical node: bitset offset and words in its place


def flatten_booster(booster: Any, num_features: int) -> bytes:
    """``booster``'s trees as the contiguous block ``kernels.ensemble_score`` reads.

    Layout (native little-endian): five int64 (trees, features, nodes, leaves, bitset words);
    per tree two int32, its first node (-1: a tree of one leaf) and its first leaf; per node,
    16 bytes: its threshold (float64; a categorical node: two int32, its bitset's first word and
    word count), two int16 children (a node of the same tree counted from its first, or ~leaf
    counted from its first leaf), the feature and the flags (uint8 each: LightGBM's decision
    type, 1 categorical, 2 missing values go left, missing type << 2) and two unused bytes;
    the leaf values (float64); the bitsets (uint32 words: bit c set, category c goes left).
    Read from LightGBM's text model (``Booster.model_to_string``), which writes every float
    with 17 significant digits, so each reads back exactly; a few ms per model.

    Raises:
        ValueError: a model ``ensemble_score`` cannot answer (several trees per iteration, an
            averaged output, linear trees, over 256 features or 32,767 leaves a tree) or text
            it does not recognise.
    """
    header: dict[str, str] = {}
    trees: list[dict[str, str]] = []
    for line in booster.model_to_string(num_iteration=-1).splitlines():
        if line.startswith("Tree="):
            trees.append({})
        elif line == "end of trees":
            break
        else:
            key, sep, value = line.partition("=")
            if sep:
                (trees[-1] if trees else header)[key] = value
            elif line == "average_output":
                raise ValueError("an averaged ensemble (random forest) does not flatten")
    if header.get("num_tree_per_iteration", "1") != "1" or not trees or num_features > 256:
        raise ValueError("only single-output ensembles of up to 256 features flatten")
    firsts: list[int] = []
    nodes: list[bytes] = []
    leaves: list[float] = []
    words: list[int] = []
    for tree in trees:
        if tree.get("is_linear", "0") != "0":
            raise ValueError("linear trees do not flatten")
        if int(tree["num_leaves"]) > 32767:
            raise ValueError("trees of over 32,767 leaves do not flatten")
        firsts += [len(nodes) if int(tree["num_leaves"]) > 1 else -1, len(leaves)]
        leaves += [float(v) for v in tree["leaf_value"].split()]
        if int(tree["num_leaves"]) == 1:
            continue
        bounds = ([int(v) for v in tree["cat_boundaries"].split()] if "cat_boundaries" in tree
                  else [])
        word_base = len(words)
        if bounds:
            words += [int(v) for v in tree["cat_threshold"].split()]
        split = [tree[k].split() for k in ("threshold", "left_child", "right_child",
                                           "split_feature", "decision_type")]
        for threshold, left, right, feature, kind in zip(*split, strict=True):
            flags = int(kind)
            if flags & 1:  # categorical: the threshold is the index of its bitset
                at = int(float(threshold))
                nodes.append(_BITS.pack(word_base + bounds[at], bounds[at + 1] - bounds[at],
                                        int(left), int(right), int(feature), flags, 0))
            else:
                nodes.append(_NODE.pack(float(threshold), int(left), int(right), int(feature),
                                        flags, 0))
    return b"".join([
        struct.pack("<5q", len(trees), num_features, len(nodes), len(leaves), len(words)),
        struct.pack(f"<{len(firsts)}i", *firsts), *nodes,
        struct.pack(f"<{len(leaves)}d", *leaves), struct.pack(f"<{len(words)}I", *words)])


class RowPredictor:
    """Raw scores of a LightGBM ``Booster``, one float64 row at a time (one thread).

    With the compiled kernels, the scores come from :func:`flatten_booster`'s block, made on
    first use and kept only if it gives LightGBM's own score, to the bit, for every one of
    ``check_rows`` (up to :attr:`CHECKED` of them, e.g. the training rows); otherwise, and
    without the kernels, from LightGBM's one-row fast path. The fast path's C handle is made on
    first use and never copied: a pickled or deep-copied predictor rebuilds its own, so copies
    (forked episodes, pool workers) never share or double-free it.
    """

    CHECKED = 256

    def __init__(self, booster: Any, num_features: int,
                 check_rows: Sequence[Sequence[float]] = ()) -> None:
        self.booster = booster
        self.num_features = num_features
        step = max(1, len(check_rows) // self.CHECKED)
        self._check = [list(r) for r in check_rows[::step][:self.CHECKED]]
        self._blob: bytes | None = None
        self._flattened = False  # whether the block was tried
        self._handle: ctypes.c_void_p | None = None

    def _init(self) -> None:
        from lightgbm.basic import _LIB, _c_str, _safe_call  # the package's own C binding

        handle = ctypes.c_void_p()
        _safe_call(_LIB.LGBM_BoosterPredictForMatSingleRowFastInit(
            self.booster._handle, ctypes.c_int(_RAW_SCORE), ctypes.c_int(0), ctypes.c_int(-1),
            ctypes.c_int(_FLOAT64), ctypes.c_int32(self.num_features), _c_str("num_threads=1"),
            ctypes.byref(handle)))
        self._handle = handle
        self._free = _LIB.LGBM_FastConfigFree
        self._predict = _LIB.LGBM_BoosterPredictForMatSingleRowFast
        self._row = (ctypes.c_double * self.num_features)()
        self._out = (ctypes.c_double * 1)()
        self._len = ctypes.c_int64()

    def _flatten(self, score: Any) -> None:
        self._flattened = True
        try:
            blob = flatten_booster(self.booster, self.num_features)
        except ValueError:  # a model the block cannot hold: the fast path answers
            return
        if [score(blob, r) for r in self._check] == self.fast_predict(self._check):
            self._blob = blob

    def predict(self, rows: Sequence[Sequence[float]]) -> list[float]:
        """The raw score of each row (each of ``num_features`` floats)."""
        score = kernels.ensemble_score
        if score is not None:
            if not self._flattened:
                self._flatten(score)
            blob = self._blob
            if blob is not None:
                return [score(blob, r) for r in rows]
        return self.fast_predict(rows)

    def scorer(self) -> Callable[[Sequence[float]], float] | None:
        """The compiled score of one row (:meth:`predict` of ``[row]``, unwrapped), or None
        where the block is not used."""
        score = kernels.ensemble_score
        if score is None:
            return None
        if not self._flattened:
            self._flatten(score)
        return None if self._blob is None else partial(score, self._blob)

    def fast_predict(self, rows: Sequence[Sequence[float]]) -> list[float]:
        """:meth:`predict` by LightGBM's one-row fast path."""
        if self._handle is None:
            self._init()
        row, out, length, handle, predict = (self._row, self._out, ctypes.byref(self._len),
                                             self._handle, self._predict)
        scores = []
        for r in rows:
            row[:] = r
            if predict(handle, row, length, out) != 0:
                from lightgbm.basic import _LIB

                raise RuntimeError(_LIB.LGBM_GetLastError().decode())
            scores.append(out[0])
        return scores

    def __getstate__(self) -> dict[str, Any]:
        return {"booster": self.booster, "num_features": self.num_features,
                "check": self._check}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["booster"], state["num_features"], state["check"])

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is not None:
            self._free(self._handle)
            self._handle = None
