"""The two mixed policies of the ordering × placement ablation.

HexAgent differs from the paper's baselines in two ways at once: it *orders* waiting calls by
projected risk, and it *places* each at the pair with the earliest projected finish (speed-,
transfer-, KV- and cache-aware). Crossing the two with per-call FCFS and the baselines'
load-balanced placement gives four policies:

| order \\ placement | earliest projected finish | load-balanced |
|---|---|---|
| projected risk | ``hexagent`` | ``hexagent-lb`` |
| FCFS (reveal order) | ``fallback`` | ``fcfs`` |

(``fallback`` is the core's own rule: the oldest waiting call at its earliest projected finish.)
"""

from __future__ import annotations

from hexagent_gym.agents.base import LeastLoadedPlacement
from hexagent_gym.agents.hexagent import HexAgentPolicy
from hexagent_gym.planning.decisions import DecisionPoint


class HexAgentLoadBalanced(HexAgentPolicy):
    """HexAgent's projected-risk order, each call at the baselines' load-balanced pair."""

    name = "hexagent-lb"

    def __init__(self, one_pass_threshold: int = 32) -> None:
        super().__init__(one_pass_threshold)
        self._placement = LeastLoadedPlacement()

    def reset(self, sim) -> None:
        super().reset(sim)
        self._placement.reset()

    def pick(self, dp: DecisionPoint) -> tuple[int, int, int]:
        slot, _, _ = super().pick(dp)
        p, d = self._placement(dp, slot)
        return slot, p, d
