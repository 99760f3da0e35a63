"""Shared pieces of the heuristic policies: a base class and the placement rules."""

from __future__ import annotations

import numpy as np

from hexagent_gym.planning.decisions import DecisionPoint, Stage
from hexagent_gym.sim.simulator import Simulator


class BasePolicy:
    """A policy over decision points (see ``hexagent_gym.policy.Policy``).

    Subclasses implement :meth:`pick`. ``reset`` is called once per episode.
    """

    name = "base"

    def reset(self, sim: Simulator) -> None:  # noqa: B027 - optional hook, empty by default
        """Drop per-episode state."""

    def pick(self, dp: DecisionPoint) -> tuple[int, int, int]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class RankedPolicy(BasePolicy):
    """Order a decision's calls once by a static key, then place each in that order.

    Subclasses give :meth:`order_key` (smaller runs first) and :meth:`place`.
    """

    def __init__(self) -> None:
        self._dp: DecisionPoint | None = None
        self._order: list[int] = []
        self._next = 0

    def reset(self, sim: Simulator) -> None:
        self._dp = None

    def order_key(self, dp: DecisionPoint, slot: int) -> tuple:
        raise NotImplementedError

    def place(self, dp: DecisionPoint, slot: int) -> tuple[int, int]:
        raise NotImplementedError

    def pick(self, dp: DecisionPoint) -> tuple[int, int, int]:
        if dp is not self._dp:  # keys are static within one decision: sort once
            self._dp = dp
            self._order = sorted(range(len(dp.calls)), key=lambda i: self.order_key(dp, i))
            self._next = 0
        slot = self._order[self._next]
        self._next += 1
        p, d = self.place(dp, slot)
        return slot, p, d


class LeastLoadedPlacement:
    """Heterogeneity-unaware placement of the paper's baselines.

    Prefill: the instance with the fewest prompt tokens queued or running; decode: the instance
    with the fewest committed calls among those that can hold the call's KV. Ties rotate
    round-robin so equal instances share work (a fixed lowest-index rule would send every call of
    an idle cluster to the first-listed GPU). Instance speed is never consulted.
    """

    def __init__(self) -> None:
        self._rr_p = 0
        self._rr_d = 0

    def reset(self) -> None:
        self._rr_p = self._rr_d = 0

    def __call__(self, dp: DecisionPoint, slot: int) -> tuple[int, int]:
        call = dp.calls[slot]
        if dp.stage == Stage.DECODE:
            return call.prefill_inst, call.decode_inst
        p = self.prefill(dp.state.pf_tokens)
        return p, self.decode(dp, slot)

    def prefill(self, load: np.ndarray, allowed: np.ndarray | None = None) -> int:
        """The least-loaded prefill instance by ``load`` (over ``allowed``), ties rotating."""
        p = _rotating_argmin(load, allowed, self._rr_p)
        self._rr_p = p + 1
        return p

    def decode(self, dp: DecisionPoint, slot: int) -> int:
        """The decode instance with the fewest committed calls that can hold the slot's KV."""
        state = dp.state
        feasible = dp.calls[slot].kv_true <= state.tables.capacity
        d = _rotating_argmin(state.dec_count, feasible, self._rr_d)
        self._rr_d = d + 1
        return d


def _rotating_argmin(load: np.ndarray, allowed: np.ndarray | None, start: int) -> int:
    """Index of the minimum of ``load`` (over ``allowed``), ties broken from ``start`` onward."""
    values = load.tolist()
    n = len(values)
    best, best_i = float("inf"), -1
    for k in range(n):
        i = (start + k) % n
        if allowed is not None and not allowed[i]:
            continue
        if values[i] < best:
            best, best_i = values[i], i
    return best_i


def earliest_pair(dp: DecisionPoint, slot: int) -> tuple[int, int, float]:
    """The joint (p, d) with the smallest projected finish Δ of one slot, and that Δ."""
    return dp.best_pair(slot)
