"""The paper's baselines, each a small policy over decision points.

All use heterogeneity-unaware, load-balanced placement (:class:`LeastLoadedPlacement`); they
differ in how they order waiting calls (``atlas`` also routes a program's calls to the prefill
instance that served its previous call, Autellix's program locality):

- ``fcfs``: per-call first come, first served (call reveal order);
- ``wf-fcfs``: workflow FCFS (workflow arrival order, then reveal order);
- ``llf``: workflow least laxity first against a deadline ``a_w + α_ref·H_w(t)``;
- ``atlas``: Autellix ATLAS, program-level least attained service with multi-level queues and
  anti-starvation;
- ``random``: a uniformly random valid (call, p, d);
- ``fallback``: the core's own rule (FIFO, earliest projected finish), for reference.
"""

from __future__ import annotations

import numpy as np

from hexagent_gym.agents.base import BasePolicy, LeastLoadedPlacement, RankedPolicy
from hexagent_gym.planning.decisions import DecisionPoint, Stage, earliest_finish_pick

ATLAS_OVERLOAD_TOKENS = 16384
"""ATLAS program locality: a program's prefill instance counts as overloaded when its queued and
running prompt tokens exceed the least-loaded instance's by more than this many tokens; the call
is then placed least-loaded instead (a few long agentic prompts of slack)."""


class _LoadBalanced(RankedPolicy):
    def __init__(self) -> None:
        super().__init__()
        self._placement = LeastLoadedPlacement()

    def reset(self, sim) -> None:
        super().reset(sim)
        self._placement.reset()

    def place(self, dp: DecisionPoint, slot: int) -> tuple[int, int]:
        return self._placement(dp, slot)


class CallFCFS(_LoadBalanced):
    """Per-call FCFS: calls in the order they were revealed, whatever their workflow."""

    name = "fcfs"

    def order_key(self, dp: DecisionPoint, slot: int) -> tuple:
        return (dp.calls[slot].reveal_seq,)


class WorkflowFCFS(_LoadBalanced):
    """Workflow FCFS: all calls of an earlier-arrived workflow go first."""

    name = "wf-fcfs"

    def order_key(self, dp: DecisionPoint, slot: int) -> tuple:
        c = dp.calls[slot]
        return (c.workflow.arrival, c.workflow.uid, c.reveal_seq)


class LeastLaxityFirst(_LoadBalanced):
    """Workflow LLF: least slack before the deadline ``a_w + α_ref · H_w(t)``.

    Laxity of a waiting call = deadline − now − its standalone duration estimate (the remaining
    critical path of the revealed subgraph through this call; later calls are not revealed).

    Args:
        alpha_ref: SLO scale that sets the deadline (default 2.0).
    """

    name = "llf"

    def __init__(self, alpha_ref: float = 2.0) -> None:
        super().__init__()
        if not alpha_ref > 0:
            raise ValueError(f"alpha_ref must be > 0, got {alpha_ref}")
        self.alpha_ref = alpha_ref

    def order_key(self, dp: DecisionPoint, slot: int) -> tuple:
        c = dp.calls[slot]
        w = c.workflow
        laxity = w.arrival + self.alpha_ref * w.h_est - dp.now - c.est_duration
        return (laxity, w.arrival, c.reveal_seq)


class Atlas(_LoadBalanced):
    """Autellix ATLAS: program-level least attained service (PLAS) on the critical path.

    A program's attained service is the longest chain of service times among its finished calls
    (the core keeps it: on completion ``service = max(service, parent service + call time)``);
    each waiting call inherits its program's value. Programs sit in multi-level queues by
    attained service (``thresholds`` in seconds, lower level first; FCFS by program arrival
    within a level). A program whose unserved time since arrival reaches ``beta`` times its
    service is promoted to the top level (anti-starvation). The Autellix paper gives no numeric
    constants; ours are documented in docs/agents.md with an ablation.

    Placement (program locality, Autellix's data-locality-aware load balancing): a call goes to
    the prefill instance of its program's latest started prefill (``workflow.last_prefill``), where
    the program's KV is likely cached, unless that instance holds more than ``overload_tokens``
    prompt tokens (queued or running, Ŝ's ``pf_tokens``) beyond the least-loaded instance; then,
    and for a program's first call, the least-loaded instance. Decode placement is always
    least-loaded. ``locality=False`` places everything least-loaded (the pre-cache baseline).

    Args:
        thresholds: increasing service levels (s) separating the queues.
        beta: starvation ratio that promotes a program to the top queue.
        locality: route by program locality (default) or purely least-loaded.
        overload_tokens: locality slack in prompt tokens (default
            :data:`ATLAS_OVERLOAD_TOKENS` = 16384).
    """

    name = "atlas"

    def __init__(self, thresholds: tuple[float, ...] = (1.0, 4.0, 16.0),
                 beta: float = 4.0, locality: bool = True,
                 overload_tokens: float = ATLAS_OVERLOAD_TOKENS) -> None:
        super().__init__()
        if list(thresholds) != sorted(thresholds) or any(t <= 0 for t in thresholds):
            raise ValueError(f"thresholds must be positive and increasing, got {thresholds}")
        if not beta > 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        if not overload_tokens >= 0:
            raise ValueError(f"overload_tokens must be >= 0, got {overload_tokens}")
        self.thresholds = tuple(thresholds)
        self.beta = beta
        self.locality = bool(locality)
        self.overload_tokens = float(overload_tokens)

    def level(self, service: float, waited: float) -> int:
        """Queue level of a program with ``service`` attained and ``waited`` unserved seconds."""
        if waited >= self.beta * max(service, self.thresholds[0]):
            return 0
        for i, t in enumerate(self.thresholds):
            if service < t:
                return i
        return len(self.thresholds)

    def order_key(self, dp: DecisionPoint, slot: int) -> tuple:
        c = dp.calls[slot]
        w = c.workflow
        waited = max(0.0, dp.now - w.arrival - w.service)
        return (self.level(w.service, waited), w.arrival, c.reveal_seq)

    def place(self, dp: DecisionPoint, slot: int) -> tuple[int, int]:
        if not self.locality or dp.stage == Stage.DECODE:
            return self._placement(dp, slot)
        home = dp.calls[slot].workflow.last_prefill
        load = dp.state.pf_tokens
        if home < 0 or load[home] - load.min() > self.overload_tokens:
            return self._placement(dp, slot)
        return home, self._placement.decode(dp, slot)

    def __repr__(self) -> str:
        return (f"Atlas(thresholds={self.thresholds}, beta={self.beta}, "
                f"locality={self.locality}, overload_tokens={self.overload_tokens:g})")


class RandomPolicy(BasePolicy):
    """A uniformly random waiting call at a uniformly random valid (p, d).

    Args:
        seed: seed of the policy's own generator, re-seeded at every episode reset.
    """

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._rng = np.random.default_rng(seed)

    def reset(self, sim) -> None:
        self._rng = np.random.default_rng(self.seed)

    def pick(self, dp: DecisionPoint) -> tuple[int, int, int]:
        remaining = dp.remaining
        slot = remaining[int(self._rng.integers(len(remaining)))]
        options = np.argwhere(dp.feasible(slot))
        p, d = options[int(self._rng.integers(len(options)))]
        return slot, int(p), int(d)


class FallbackPolicy(BasePolicy):
    """The core's fallback: FIFO order, earliest projected finish placement."""

    name = "fallback"

    def pick(self, dp: DecisionPoint) -> tuple[int, int, int]:
        return earliest_finish_pick(dp)
