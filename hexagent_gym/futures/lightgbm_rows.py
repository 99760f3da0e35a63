"""One-row LightGBM predictions at C speed, for forecasts asked one workflow at a time.

``Booster.predict`` converts and validates its input and builds a prediction config on every
call: about 25-100 µs for one row, which at one forecast per simulated call was most of the
horizon forecast's cost. LightGBM's C API has a documented fast path for exactly this case
(``LGBM_BoosterPredictForMatSingleRowFastInit`` once per model, then
``LGBM_BoosterPredictForMatSingleRowFast`` per row: about 3 µs). It runs the same trees, so the
predictions are bit-identical to ``Booster.predict(..., raw_score=True)`` (a test holds it).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

_RAW_SCORE = 1  # C_API_PREDICT_RAW_SCORE
_FLOAT64 = 1  # C_API_DTYPE_FLOAT64


class RowPredictor:
    """Raw scores of a LightGBM ``Booster``, one float64 row at a time (one thread).

    The C handle is made on first use and never copied: a pickled or deep-copied predictor
    rebuilds its own, so copies (forked episodes, pool workers) never share or double-free it.
    """

    def __init__(self, booster: Any, num_features: int) -> None:
        self.booster = booster
        self.num_features = num_features
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

    def predict(self, rows: Sequence[Sequence[float]]) -> list[float]:
        """The raw score of each row (each of ``num_features`` floats)."""
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
        return {"booster": self.booster, "num_features": self.num_features}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["booster"], state["num_features"])

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is not None:
            self._free(self._handle)
            self._handle = None
