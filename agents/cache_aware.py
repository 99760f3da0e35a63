"""``sglang-router``: SGLang's cache-aware load balancer (sgl-router ``cache_aware``) as a baseline.

sgl-router routes each request when it arrives, in arrival order, with one rule per worker pool
(``sgl-router/src/policies/cache_aware.rs``; in PD mode the prefill pool uses it and the decode
pool takes the least-loaded worker):

1. *imbalanced* load — ``max − min > balance_abs_threshold`` **and**
   ``max > balance_rel_threshold · min`` over the workers' loads (requests routed there and not
   finished) — sends the request to the least-loaded worker;
2. otherwise the worker with the longest prefix match of the request wins if its match ratio
   (matched / prompt length) is **above** ``cache_threshold``;
3. otherwise the worker with the *smallest tree* (the least cached data, "most available cache
   capacity").

Here a worker is a prefill instance and a request a call. Defaults are sgl-router's
(``CacheAwareConfig``: ``cache_threshold`` 0.5, ``balance_abs_threshold`` 32,
``balance_rel_threshold`` 1.0001). The emulation's choices:

- order: FCFS by call reveal (the router is first come, first served; so is each engine's queue);
- load of a prefill instance: calls queued or running on it, not counting the calls of the
  decision's window (the simulator re-plans every waiting call, as for the other baselines), plus
  the calls this decision has already routed there;
- prefix match: the instance's actual prefix cache at the decision (``dp.cached``), i.e. an exact
  tree instead of sgl-router's approximate one built from routed request text;
- tree size: the instance's cached tokens plus the prompt tokens queued or running on it
  (Ŝ's ``pf_tokens``, this decision's picks included), which mirrors the router's tree growing at
  routing time; ``on_miss="least-loaded"`` replaces rule 3 by the least-loaded instance;
- ties (several instances at the lowest load, best match or smallest tree) go to the
  least-loaded of them, then rotate as in :class:`~hexagent_gym.agents.base.LeastLoadedPlacement`;
- decode: the least-loaded instance (fewest committed calls) that can hold the call's KV.

Instance speed is never consulted: the router is heterogeneity-unaware.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from hexagent_gym.agents.base import LeastLoadedPlacement, RankedPolicy
from hexagent_gym.planning.decisions import DecisionPoint, Stage
from hexagent_gym.planning.entities import CallState

if TYPE_CHECKING:
    from hexagent_gym.sim.simulator import Simulator

SGL_CACHE_THRESHOLD = 0.5
"""sgl-router ``--cache-threshold`` default: minimum prefix match ratio (strictly above) for
cache-affinity routing."""
SGL_BALANCE_ABS_THRESHOLD = 32
"""sgl-router ``--balance-abs-threshold`` default (requests)."""
SGL_BALANCE_REL_THRESHOLD = 1.0001
"""sgl-router ``--balance-rel-threshold`` default."""
ON_MISS = ("smallest-cache", "least-loaded")


class SGLangRouter(RankedPolicy):
    """SGLang router's ``cache_aware`` policy on the prefill pool, least-loaded decode, FCFS.

    Args:
        cache_threshold: prefix match ratio above which the best-matching instance is taken.
        balance_abs_threshold: load gap (calls) above which, with the relative condition, the
            pool counts as imbalanced.
        balance_rel_threshold: ratio max / min load above which, with the absolute condition,
            the pool counts as imbalanced.
        on_miss: rule when no match clears the threshold: ``"smallest-cache"`` (sgl-router's
            smallest tree) or ``"least-loaded"``.
    """

    name = "sglang-router"

    def __init__(self, cache_threshold: float = SGL_CACHE_THRESHOLD,
                 balance_abs_threshold: float = SGL_BALANCE_ABS_THRESHOLD,
                 balance_rel_threshold: float = SGL_BALANCE_REL_THRESHOLD,
                 on_miss: str = "smallest-cache") -> None:
        super().__init__()
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {cache_threshold}")
        if not balance_abs_threshold >= 0:
            raise ValueError(f"balance_abs_threshold must be >= 0, got {balance_abs_threshold}")
        if not balance_rel_threshold >= 1.0:
            raise ValueError(f"balance_rel_threshold must be >= 1, got {balance_rel_threshold}")
        if on_miss not in ON_MISS:
            raise ValueError(f"on_miss must be one of {ON_MISS}, got {on_miss!r}")
        self.cache_threshold = float(cache_threshold)
        self.balance_abs_threshold = float(balance_abs_threshold)
        self.balance_rel_threshold = float(balance_rel_threshold)
        self.on_miss = on_miss
        self._placement = LeastLoadedPlacement()
        self._sim: Simulator | None = None
        self._load_dp: DecisionPoint | None = None
        self._load = np.zeros(0)

    def reset(self, sim: Simulator) -> None:
        super().reset(sim)
        self._placement.reset()
        self._sim = sim
        self._load_dp = None

    def order_key(self, dp: DecisionPoint, slot: int) -> tuple:
        return (dp.calls[slot].reveal_seq,)

    def loads(self, dp: DecisionPoint) -> np.ndarray:
        """Calls queued or running per prefill instance (outside the window, plus this
        decision's picks so far). The array is the policy's own: picks update it."""
        if dp is not self._load_dp:
            sim = self._sim
            if sim is None:
                raise RuntimeError("SGLangRouter.reset(sim) must run before pick(dp): the "
                                   "router counts the calls queued on each prefill instance")
            # the window's queued calls are those waiting for their prefill and placed: count
            # them off each queue's length, not scan the queue (O(window), docs/overload.md)
            in_window = [0] * len(sim.prefill)
            for c in dp.calls:
                if c.state == CallState.WAITING_PREFILL and c.prefill_inst >= 0:
                    in_window[c.prefill_inst] += 1
            self._load = np.array(
                [len(inst.queue) - in_window[p] + (inst.running is not None)
                 for p, inst in enumerate(sim.prefill)], dtype=np.float64)
            self._load_dp = dp
        return self._load

    def imbalanced(self, load: np.ndarray) -> bool:
        """sgl-router's test: both the absolute and the relative load gap are exceeded."""
        hi, lo = float(load.max()), float(load.min())
        return hi - lo > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo

    def place(self, dp: DecisionPoint, slot: int) -> tuple[int, int]:
        call = dp.calls[slot]
        if dp.stage == Stage.DECODE:
            return call.prefill_inst, call.decode_inst
        load = self.loads(dp)
        p = self.route(dp, slot, load)
        load[p] += 1.0
        return p, self._placement.decode(dp, slot)

    def route(self, dp: DecisionPoint, slot: int, load: np.ndarray) -> int:
        """The prefill instance of one call under the current ``load``."""
        down = dp.state.fault_down[0]  # instances a fault took out of the pool (faults.md)
        up = None
        if down:
            up = np.ones(len(load), dtype=bool)
            up[sorted(down)] = False

        def lowest(load: np.ndarray, allowed: np.ndarray | None = None) -> int:
            if up is not None:
                allowed = up if allowed is None else allowed & up
            return self._placement.prefill(load, allowed)

        if self.imbalanced(load if up is None else load[up]):
            return lowest(load)
        ratio = dp.cached[slot] / max(dp.calls[slot].l_in, 1)
        if up is not None:
            ratio = np.where(up, ratio, -1.0)
        best = float(ratio.max())
        if best > self.cache_threshold:
            return lowest(load, ratio == best)
        if self.on_miss == "least-loaded":
            return lowest(load)
        size = dp.state.pf_tokens.copy()
        caches = self._sim.caches if self._sim is not None else None
        if caches is not None:
            block = self._sim.block_tokens
            size += np.array([len(c) * block for c in caches], dtype=np.float64)
        return lowest(load, size == size.min())

    def __repr__(self) -> str:
        return (f"SGLangRouter(cache_threshold={self.cache_threshold:g}, "
                f"balance_abs_threshold={self.balance_abs_threshold:g}, "
                f"balance_rel_threshold={self.balance_rel_threshold:g}, "
                f"on_miss={self.on_miss!r})")
