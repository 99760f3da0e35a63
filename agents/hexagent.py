"""HexAgent's projected-risk greedy (arXiv 2605.16637, Algorithm 1) as a policy.

At each pick it ranks the waiting calls by projected risk

    R(c) = ((t − a_w) + min_{p,d} Δ(c, p, d)) / H_w(t)

(the workflow's elapsed time plus the call's earliest projected completion, relative to the
workflow's running standalone horizon) and places the riskiest call at its argmin pair. Δ comes
from the core's simulated state Ŝ, which the pick updates, so the next risk ranking sees it:
at the prefill stage the joint (p, d) with the earliest projected decode finish including the KV
transfer; at the decode stage the earliest capacity-feasible finish on the locked instance.

Above ``one_pass_threshold`` waiting calls, the ranking is computed once per decision (one-pass
ordering) and each call is then placed at its argmin under the updated Ŝ, which keeps the
cost linear in the queue length.

Prefill times in Δ are cache-aware by default: each prefill instance is priced with the prompt
tokens its prefix cache already holds for the call (``dp.batch.pf``). ``cache_aware=False``
(registered as ``hexagent-nocache``) plans with the no-cache estimates (``call.pf_cold``) for an
ablation; the simulator still serves the hits, the planner just does not see them.
"""

from __future__ import annotations

import numpy as np

from hexagent_gym.agents.base import BasePolicy
from hexagent_gym.decisions import DecisionPoint, Stage


def projected_risk(dp: DecisionPoint, best: np.ndarray | None = None) -> np.ndarray:
    """R(c) for every slot of ``dp`` (picked slots get −inf) from each slot's smallest Δ
    ``best`` (n,) (default ``dp.min_delta``, under the current Ŝ)."""
    if best is None:
        best = dp.min_delta
    batch = dp.batch
    risk = ((dp.now - batch.arrival) + best) / batch.h_est
    risk[np.asarray(dp.picked)] = -np.inf
    return risk


class HexAgentPolicy(BasePolicy):
    """Projected-risk greedy with joint prefill/decode placement.

    Args:
        one_pass_threshold: decisions with more waiting calls than this rank once per decision
            instead of after every pick (default 32).
        cache_aware: project prefill times with each instance's prefix-cache hits (default);
            False calls ``dp.ignore_cache()`` at every new prefill decision, so Δ uses the
            no-cache estimates (the policy's name becomes ``hexagent-nocache``).
    """

    name = "hexagent"

    def __init__(self, one_pass_threshold: int = 32, cache_aware: bool = True) -> None:
        if one_pass_threshold < 1:
            raise ValueError(f"one_pass_threshold must be >= 1, got {one_pass_threshold}")
        self.one_pass_threshold = one_pass_threshold
        self.cache_aware = bool(cache_aware)
        if not self.cache_aware and not self.name.endswith("-nocache"):
            self.name = f"{self.name}-nocache"
        self._dp: DecisionPoint | None = None
        self._seen: DecisionPoint | None = None  # last decision seen (cache view set up)
        self._inputs_of: DecisionPoint | None = None  # decision of _arrival and _h_est
        self._plan_of: DecisionPoint | None = None  # last decision asked for dp.risk_plan
        self._arrival: list[float] = []
        self._h_est: list[float] = []
        self._order: list[int] = []
        self._next = 0

    def reset(self, sim) -> None:
        self._dp = None
        self._seen = None
        self._inputs_of = None
        self._plan_of = None

    def pick(self, dp: DecisionPoint) -> tuple[int, int, int]:
        if dp is not self._seen:
            self._seen = dp
            if not self.cache_aware and dp.stage == Stage.PREFILL:
                dp.ignore_cache()
        n = len(dp.calls)
        if n > self.one_pass_threshold:
            slot = self._one_pass_slot(dp)
        elif n > 1 and (ahead := self._ahead_pick(dp)) is not None:
            return ahead
        elif dp.num_remaining == 1:  # the argmax of one finite risk among −inf: no projection
            slot = 0 if n == 1 else dp.picked.index(False)
        else:
            slot = self._riskiest(dp)
        p, d, _ = dp.best_pair(slot)
        return slot, p, d

    def decide(self, dp: DecisionPoint) -> None:
        """Make the picks :meth:`pick` would return one by one: when its first pick is the
        compiled ranking's (``dp.risk_plan``), the whole plan in one call
        (``dp.follow_plan``), else that pick and whatever plan follows it (the simulator asks
        :meth:`pick` for any calls left). A subclass with its own ``pick`` (another placement
        or lookahead) is left to it: its picks may leave the plan anywhere.
        """
        if type(self).pick is not HexAgentPolicy.pick:
            return
        first = self.pick(dp)
        planned = dp.planned_pick()
        if planned is None or planned[:3] != first:  # else follow_plan makes it with the rest
            dp.pick(*first)
        dp.follow_plan()

    def _ahead_pick(self, dp: DecisionPoint) -> tuple[int, int, int] | None:
        """This pick from the compiled twin of this policy's ranking (``dp.risk_plan``, asked
        once per decision at its first pick) while every pick made so far followed it; None:
        rank in Python (the twin stopped early, a pick left its plan, or none was asked)."""
        if dp is not self._plan_of:
            self._plan_of = dp
            if not dp.plan:
                dp.risk_plan()
        planned = dp.planned_pick()
        return None if planned is None else planned[:3]

    def _riskiest(self, dp: DecisionPoint) -> int:
        """``argmax(projected_risk(dp))`` over a short window in scalar Python: the same IEEE
        operations on the same floats, and the first slot of the largest risk, as numpy's."""
        if dp is not self._inputs_of:
            self._inputs_of = dp
            self._arrival = [c.workflow.arrival for c in dp.calls]
            self._h_est = [c.workflow.h_est for c in dp.calls]  # as CallBatch.h_est: at the
            # decision's first ranking (nothing changes a horizon while a decision is open)
        now, arrival, h_est = dp.now, self._arrival, self._h_est
        slot, top = -1, -np.inf
        for i, best in enumerate(dp.min_delta_values()):
            if dp.picked[i]:
                continue
            h = h_est[i]
            if h == 0.0:  # numpy divides by zero to inf or NaN; Python raises: let numpy rank
                return self._numpy_riskiest(dp)
            risk = ((now - arrival[i]) + best) / h
            if risk > top:
                slot, top = i, risk
            elif risk != risk:  # NaN: numpy's argmax returns the first NaN
                return self._numpy_riskiest(dp)
        return slot if slot >= 0 else self._numpy_riskiest(dp)

    @staticmethod
    def _numpy_riskiest(dp: DecisionPoint) -> int:
        with np.errstate(divide="ignore", invalid="ignore"):
            return int(np.argmax(projected_risk(dp)))

    def _one_pass_slot(self, dp: DecisionPoint) -> int:
        if dp is not self._dp:
            self._dp = dp
            risk = projected_risk(dp)
            self._order = np.argsort(-risk, kind="stable").tolist()
            self._next = 0
        slot = self._order[self._next]
        self._next += 1
        return slot

    def __repr__(self) -> str:
        extra = "" if self.cache_aware else ", cache_aware=False"
        return f"HexAgentPolicy(one_pass_threshold={self.one_pass_threshold}{extra})"


class HexAgentNoCache(HexAgentPolicy):
    """HexAgent planning with cache-oblivious prefill estimates (``hexagent-nocache``)."""

    name = "hexagent-nocache"

    def __init__(self, one_pass_threshold: int = 32) -> None:
        super().__init__(one_pass_threshold, cache_aware=False)
