"""The constant per-call arrays of a decision's window (:class:`CallBatch`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from hexagent_gym.planning.cluster_tables import mean_own_context

if TYPE_CHECKING:
    from hexagent_gym.planning.cluster_tables import ClusterTables
    from hexagent_gym.planning.entities import Call


class _Core:
    """A :class:`CallBatch` array that is built, with the window's other core arrays
    (``_build_core``), on its first read; stored in the slot of its name with a leading ``_``."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc
        self.slot = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, batch: CallBatch | None, owner: type | None = None):
        if batch is None:
            return self
        if batch._l_in is None:
            batch._build_core()
        return getattr(batch, self.slot)


class CallBatch:
    """Constant per-call arrays of a decision's window, built once and reused at every pick.

    Every array is built on first use: a policy that reads only the workflows' arrivals and
    horizons (HexAgent's risk with the scalar picks) pays for nothing else."""

    __slots__ = ("_pf", "_weight", "_ctx", "_kv_pred", "_l_in", "_too_big", "_any_too_big",
                 "_prefill_inst", "_decode_inst", "_arrival", "_h_est", "_locked", "_xfer",
                 "_xfer_cls", "_tables", "_calls", "_cached", "_cache_aware")

    def __init__(self, tables: ClusterTables, calls: list[Call], cache_aware: bool = True) -> None:
        self._tables = tables
        self._calls = calls
        self._cache_aware = cache_aware
        self._l_in = None  # with pf, weight, ctx, kv_pred, too_big, any_too_big: _build_core
        self._pf = self._weight = self._ctx = self._kv_pred = self._too_big = None
        self._any_too_big = False
        self._cached = self._xfer = self._xfer_cls = None
        self._prefill_inst = self._decode_inst = self._arrival = self._h_est = None
        self._locked = None

    def _build_core(self) -> None:
        calls, tables = self._calls, self._tables
        l_in = np.array([c.l_in for c in calls], dtype=np.float64)
        l_out = np.array([c.l_out_pred for c in calls], dtype=np.float64)
        err = np.array([c.dec_err for c in calls])
        # (n, P) estimated prefill seconds: with the cache hits each instance offers, or cold
        self._pf = np.array([c.pf_est if self._cache_aware else c.pf_cold for c in calls])
        self._weight = l_out * err  # decode seconds = weight · per-token step time
        self._ctx = mean_own_context(l_in, l_out)
        # predicted KV demand: L_in + L̂_out, for a sample group's leader the whole group's
        self._kv_pred = np.array([c.kv_pred for c in calls], dtype=np.float64)
        kv_true = np.array([c.kv_true for c in calls], dtype=np.float64)
        self._too_big = kv_true[:, None] > tables.capacity[None, :]  # (n, D) never fits
        self._any_too_big = bool(self._too_big.any())
        self._l_in = l_in

    l_in = _Core("(n,) prompt tokens.")
    pf = _Core("(n, P) estimated prefill seconds on each instance (cache-aware unless the "
               "decision ignores the cache).")
    weight = _Core("(n,) predicted output tokens × decode error: decode seconds per unit step "
                   "time.")
    ctx = _Core("(n,) mean own context over the call's decode.")
    kv_pred = _Core("(n,) predicted KV demand (a sample group's leader: the whole group's).")
    too_big = _Core("(n, D) bool: the call's true KV never fits on the decode instance.")
    any_too_big = _Core("Whether any entry of too_big is True.")

    @property
    def prefill_inst(self) -> np.ndarray:
        """(n,) int64 prefill instance each call is placed on (-1: not placed)."""
        if self._prefill_inst is None:
            self._prefill_inst = np.array([c.prefill_inst for c in self._calls], dtype=np.int64)
        return self._prefill_inst

    @property
    def decode_inst(self) -> np.ndarray:
        """(n,) int64 decode instance each call is placed on (-1: not placed)."""
        if self._decode_inst is None:
            self._decode_inst = np.array([c.decode_inst for c in self._calls], dtype=np.int64)
        return self._decode_inst

    @property
    def arrival(self) -> np.ndarray:
        """(n,) arrival a_w of each call's workflow."""
        if self._arrival is None:
            self._arrival = np.array([c.workflow.arrival for c in self._calls])
        return self._arrival

    @property
    def h_est(self) -> np.ndarray:
        """(n,) running horizon H_w(t) of each call's workflow, as it was at this decision."""
        if self._h_est is None:
            self._h_est = np.array([c.workflow.h_est for c in self._calls])
        return self._h_est

    @property
    def locked(self) -> np.ndarray:
        """(n,) bool: at the decode stage a call is locked to its instance once that instance
        has served it (a preempted call) or once it has moved; before that it is free to move."""
        if self._locked is None:
            self._locked = np.array([c.preempted > 0 or c.moved for c in self._calls],
                                    dtype=bool)
        return self._locked

    @property
    def cached(self) -> np.ndarray:
        """(n, P) prompt tokens each prefill instance's cache holds for each call (built on
        first use)."""
        if self._cached is None:
            t = self._tables
            self._cached = np.zeros((len(self._calls), t.num_prefill))
            for i, c in enumerate(self._calls):
                if c.cached is not None:
                    self._cached[i] = c.cached
        return self._cached

    @property
    def xfer(self) -> np.ndarray:
        """(n, P, D) KV-transfer seconds of each call on each pair (built on first use)."""
        if self._xfer is None:
            t = self._tables
            self._xfer = t.setup + self.l_in[:, None, None] * t.s_per_token
        return self._xfer

    @property
    def xfer_cls(self) -> np.ndarray:
        """(n, K, D) KV-transfer seconds per prefill class (the same values as :attr:`xfer` on
        any member of the class)."""
        if self._xfer_cls is None:
            t = self._tables
            self._xfer_cls = t.setup_cls + self.l_in[:, None, None] * t.spt_cls
        return self._xfer_cls

    def row(self, i: int) -> CallBatch:
        """A one-call batch viewing row ``i`` (no copies of the arrays built so far)."""
        if self._l_in is None:
            self._build_core()
        out = CallBatch.__new__(CallBatch)
        for name in CallBatch.__slots__:
            value = getattr(self, name)
            if name in ("_any_too_big", "_tables", "_cache_aware") or value is None:
                setattr(out, name, value)
            else:
                setattr(out, name, value[i:i + 1])
        out._any_too_big = bool(out._too_big.any())
        return out
