"""HexAgent with a one-step lookahead over its pick order: a stronger teacher for learned policies.

HexAgent picks the call with the largest projected risk R(c) and places it at its argmin pair.
Under a saturated prefill stage that greedy rule ignores what the pick does to the calls still
waiting: placing a long prompt first can push a short, nearly as risky call further than it
would have cost to serve the short one first. This policy considers the ``candidates`` riskiest
calls; for each it commits the call at its argmin pair to a copy of Ŝ
(:meth:`hexagent_gym.planning.plan_state.PlanState.copy`), re-projects the rest and scores the pick
by the largest risk that results, max(R(c), max over the other calls of R'(c')). It takes the pick
with the smallest score; ties go to the riskier call, so HexAgent's own pick wins unless another one
strictly lowers the worst projected risk. ``candidates=1`` is exactly HexAgent.

The decode stage, and prefill decisions with more than ``one_pass_threshold`` waiting calls, keep
HexAgent's rule (at decode, calls are locked to their instance; the order only sets queue ranks).
Each lookahead pick copies Ŝ and re-projects the other waiting calls once per live candidate, on
top of HexAgent's own projection. Measured effect and cost: docs/agents.md.
"""

from __future__ import annotations

import numpy as np

from hexagent_gym.agents.base import earliest_pair
from hexagent_gym.agents.hexagent import HexAgentPolicy, projected_risk
from hexagent_gym.planning.decisions import DecisionPoint, Stage


class HexAgentLookahead(HexAgentPolicy):
    """Projected-risk greedy whose pick minimises the worst projected risk one pick ahead.

    Args:
        candidates: how many of the riskiest calls to try at each pick (>= 1; 1 is HexAgent).
        one_pass_threshold: as for :class:`HexAgentPolicy`: larger decisions rank once and
            skip the lookahead, which keeps the cost linear in the queue length.
    """

    name = "hexagent-lookahead"

    def __init__(self, candidates: int = 4, one_pass_threshold: int = 32) -> None:
        super().__init__(one_pass_threshold)
        if candidates < 1:
            raise ValueError(f"candidates must be >= 1, got {candidates}")
        self.candidates = candidates

    def pick(self, dp: DecisionPoint) -> tuple[int, int, int]:
        if (self.candidates == 1 or dp.stage != Stage.PREFILL
                or len(dp.calls) > self.one_pass_threshold):
            return super().pick(dp)
        delta = dp.delta
        risk = projected_risk(dp, _min_over_pairs(delta))
        live = np.isfinite(risk)
        order = np.argsort(-risk, kind="stable")[: self.candidates]
        slots = [int(s) for s in order if live[s]]
        if len(slots) == 1:
            return slots[0], *earliest_pair(dp, slots[0])[:2]
        best_score, best = np.inf, None
        for slot in slots:
            pick = (slot, *earliest_pair(dp, slot)[:2])
            score = lookahead_score(dp, delta, risk, live, pick)
            if score < best_score:  # strict: on ties the riskier call (HexAgent's) stays
                best_score, best = score, pick
        return best

    def __repr__(self) -> str:
        return (f"HexAgentLookahead(candidates={self.candidates}, "
                f"one_pass_threshold={self.one_pass_threshold})")


def lookahead_score(dp: DecisionPoint, delta: np.ndarray, risk: np.ndarray, live: np.ndarray,
                    pick: tuple[int, int, int]) -> float:
    """max(R(slot), max R'(other live calls)) after committing ``pick`` to a copy of Ŝ."""
    slot, p, d = pick
    state = dp.state.copy()
    state.commit(dp.calls[slot], p, d, float(delta[slot, p, d]), True)
    others = projected_risk(dp, _min_over_pairs(state.project_prefill(dp.batch)))
    others = others[live & (np.arange(len(dp.calls)) != slot)]
    own = float(risk[slot])
    return max(own, float(others.max())) if others.size else own


def _min_over_pairs(delta: np.ndarray) -> np.ndarray:
    return delta.reshape(len(delta), -1).min(axis=1)
