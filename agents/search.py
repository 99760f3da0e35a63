"""HexAgent with rollout search: how far is the greedy from the best schedule it could reach?

At each pick, :class:`HexAgentSearch` takes HexAgent's own pick and the next ``k − 1``
alternatives in HexAgent's preference order (alternately: the next-riskiest call at its argmin
pair, and HexAgent's call at its next-best pair), forks the simulator
(:func:`hexagent_gym.sim.fork.fork`) once per candidate, applies the candidate and continues the
fork under plain HexAgent, then keeps the candidate whose rollout scores best: the smallest
(Req99, mean ratio) over the scored workflows, ties to the earlier candidate, so HexAgent's pick
stays unless another one is strictly better. ``k = 1`` is exactly HexAgent.

Two variants (``docs/learned.md`` reports both next to HexAgent):

- ``hexagent-search-oracle`` (``oracle=True``): the fork is the true future (arrivals yet to
  come, hidden calls, true output lengths) and ratios use the true standalone times H_w. An upper
  bound on what a better pick order and placement can achieve: not implementable. With
  ``max_backlog`` set (the default) its future holds the next ``max_backlog`` arrivals, no more.
- ``hexagent-search`` (``oracle=False``): the fork knows only what a scheduler could: no future
  arrivals (the workload is cut at the workflows already arrived), predicted output lengths in
  place of the true ones for every call not yet decoding, and ratios against the scheduler's
  running horizon H_w(t) at the workflow's finish. It still unfolds each arrived workflow's
  remaining calls as they truly are (it assumes the workflow's DAG template is known, as for a
  templated agent) and keeps a decoding call's true length; both are stated departures.
- ``hexagent-search-revealed`` (``knowledge="revealed"``): the implementable search without the
  first departure: the fork holds only the calls revealed so far (:func:`hexagent_gym.sim.fork.
  revealed_only`), so each workflow ends, in the rollout, with its last revealed call; it sees
  what HexAgent and the env's observation see. It tells how much of the search's gain needs the
  workflows' future calls (``docs/learned.md``).

``horizon="arrived"`` (the default) ends a rollout when every workflow that had arrived at the
fork has finished and scores those; ``horizon="episode"`` runs the oracle to the end of the
episode and scores every workflow. Decisions with more than ``one_pass_threshold`` waiting calls
keep HexAgent's one-pass rule, and so do decisions taken while more than ``max_backlog``
arrived workflows are unfinished (64 by default; None: no bound): a rollout runs every arrived
workflow to its end, so a pick costs k rollouts of the whole backlog, which under overload grows
without bound (docs/overload.md). The 50-workflow episodes of docs/learned.md never reach the
default bound. Cost: k forks and rollouts per pick (seconds per pick on hundreds of workflows);
this is a bound and a teacher, not a production scheduler.
"""

from __future__ import annotations

import math
from itertools import islice, zip_longest

import numpy as np

from hexagent_gym.agents.hexagent import HexAgentPolicy, projected_risk
from hexagent_gym.planning.decisions import DecisionPoint, Stage
from hexagent_gym.sim.fork import (
    ForkShare,
    cut_arrivals,
    fork,
    known_only,
    pending_decision,
    revealed_only,
)
from hexagent_gym.sim.metrics import req, slo_ratio

HORIZONS = ("arrived", "episode")
MAX_BACKLOG = 64
"""The default bound on arrived, unfinished workflows above which the search keeps HexAgent's
pick (its rollouts would cost the whole backlog; docs/overload.md)."""
KNOWLEDGE = ("template", "revealed")


class HexAgentSearch(HexAgentPolicy):
    """Rollout search over HexAgent's top-``k`` candidate picks (see the module docstring).

    Args:
        k: candidates per pick (>= 1; 1 is HexAgent).
        oracle: roll out the true future (upper bound) instead of the scheduler's knowledge.
        horizon: ``"arrived"`` or ``"episode"`` (the latter only with ``oracle=True``: without
            future arrivals the episode ends with the arrived workflows).
        one_pass_threshold: as for :class:`~hexagent_gym.agents.hexagent.HexAgentPolicy`.
        knowledge: what an implementable fork holds of the arrived workflows: ``"template"``
            (their remaining calls, unfolded as they truly are) or ``"revealed"`` (the calls
            revealed so far only). Ignored by the oracle, which holds the true future.
        max_backlog: search only while at most this many arrived workflows are unfinished
            (an integer >= 1; None: always), else keep HexAgent's pick, so that a pick's cost
            stays bounded under overload; the oracle's rollouts (``horizon="arrived"``) see
            the true future up to the next ``max_backlog`` arrivals. With ``horizon="episode"``
            a rollout runs the whole remaining episode whatever the backlog, so its cost is not
            bounded by it.
    """

    name = "hexagent-search"
    pause_gc = False  # every search drops forks of the simulator, whose objects form cycles

    def __init__(self, k: int = 4, oracle: bool = False, horizon: str = "arrived",
                 one_pass_threshold: int = 32, knowledge: str = "template",
                 max_backlog: int | None = MAX_BACKLOG) -> None:
        super().__init__(one_pass_threshold)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        if max_backlog is not None and (isinstance(max_backlog, bool)
                                        or not isinstance(max_backlog, int) or max_backlog < 1):
            raise ValueError(f"max_backlog must be an integer >= 1 or None (no bound), got "
                             f"{max_backlog!r}")
        if horizon not in HORIZONS:
            raise ValueError(f"horizon must be one of {', '.join(HORIZONS)}, got {horizon!r}")
        if horizon == "episode" and not oracle:
            raise ValueError("horizon='episode' needs oracle=True: the implementable search "
                             "knows no future arrivals, so its rollouts end with the arrived "
                             "workflows (use horizon='arrived')")
        if knowledge not in KNOWLEDGE:
            raise ValueError(f"knowledge must be one of {', '.join(KNOWLEDGE)}, got "
                             f"{knowledge!r}")
        self.k = k
        self.max_backlog = max_backlog
        self.oracle = bool(oracle)
        self.knowledge = knowledge
        self.horizon = horizon
        if self.oracle:
            self.name = "hexagent-search-oracle"
        elif knowledge == "revealed":
            self.name = "hexagent-search-revealed"
        self._sim = None
        self._shared: ForkShare | None = None
        self.rollouts = 0  # rollouts run this episode (cost accounting)
        self.over_backlog = 0  # picks left to HexAgent because the backlog was over the bound
        self.changed = 0  # picks where a candidate other than HexAgent's won
        # one row per changed pick: (kind, window size, Req99 gain, mean-ratio gain) of the
        # winner over HexAgent's candidate; kind "pair" (HexAgent's call, another pair) or
        # "call" (another call first)
        self.deviations: list[tuple[str, int, float, float]] = []

    def reset(self, sim) -> None:
        super().reset(sim)
        self._sim = sim
        self._shared = ForkShare(sim)
        self.rollouts = self.changed = self.over_backlog = 0
        self.deviations = []

    def pick(self, dp: DecisionPoint) -> tuple[int, int, int]:
        own = super().pick(dp)
        sim = self._sim
        if self.k == 1 or len(dp.calls) > self.one_pass_threshold or sim is None:
            return own
        if (self.max_backlog is not None
                and len(sim.workflows) - len(sim.finished) > self.max_backlog):
            self.over_backlog += 1
            return own
        cands = self.candidates(dp, own)
        if len(cands) == 1:
            return own
        own_score = self._score(cands[0])
        best, best_score = own, own_score
        for cand in cands[1:]:
            score = self._score(cand)
            if score < best_score:  # strict: ties keep the earlier (HexAgent-preferred) one
                best, best_score = cand, score
        if best != own:
            self.changed += 1
            kind = "pair" if best[0] == own[0] else "call"
            self.deviations.append((kind, len(dp.calls), own_score[0] - best_score[0],
                                    own_score[1] - best_score[1]))
        return best

    def candidates(self, dp: DecisionPoint,
                   own: tuple[int, int, int]) -> list[tuple[int, int, int]]:
        """HexAgent's pick, then alternately the next-riskiest call at its argmin pair and
        HexAgent's call at its next-best pair (none at the decode stage), up to ``k``."""
        slot0 = own[0]
        risk = projected_risk(dp)
        others = [int(s) for s in np.argsort(-risk, kind="stable")
                  if s != slot0 and math.isfinite(risk[s])]
        pairs: list[tuple[int, int]] = []
        if dp.stage == Stage.PREFILL:
            row = dp.delta_row(slot0)
            flat = np.argsort(row, axis=None, kind="stable")
            D = row.shape[1]
            pairs = [(int(i) // D, int(i) % D) for i in flat[:self.k]
                     if math.isfinite(row.flat[i])]
            pairs = [pd for pd in pairs if pd != own[1:]]
        slot_alts = ((s, *dp.best_pair(s)[:2]) for s in others)  # lazy: best pairs on demand
        pair_alts = [(slot0, p, d) for p, d in pairs]
        alternating = (c for both in zip_longest(slot_alts, pair_alts) for c in both
                       if c is not None)
        return [own, *islice(alternating, self.k - 1)]

    # -- rollouts -------------------------------------------------------------------------------
    def _score(self, cand: tuple[int, int, int]) -> tuple[float, float]:
        self.rollouts += 1
        (sim,) = fork(self._sim, shared=self._shared)
        if not self.oracle:
            (revealed_only if self.knowledge == "revealed" else known_only)(sim)
        elif self.max_backlog is not None and self.horizon == "arrived":
            # the true future, up to the next max_backlog arrivals: under overload the scored
            # workflows would otherwise finish only after a stream of later arrivals whose
            # length grows with the episode's
            cut_arrivals(sim, len(sim.workflows) + self.max_backlog)
        scored = len(sim.workflows) if self.horizon == "arrived" else None
        dp = pending_decision(sim)
        dp.pick(*cand)
        policy = HexAgentPolicy(self.one_pass_threshold, self.cache_aware)
        policy.reset(sim)
        done = _Finished(sim, scored)
        while True:
            while not dp.done:
                dp.pick(*policy.pick(dp))
            if done.all():
                break
            dp = sim.run_until_decision()
            if dp is None:
                break
        wfs = sim.workflows if scored is None else sim.workflows[:scored]
        if self.oracle:
            ratios = np.array([slo_ratio(w.arrival, w.finish_t, w.horizon) for w in wfs])
        else:
            ratios = np.array([(w.finish_t - w.arrival) / w.h_est for w in wfs])
        return req(ratios, 0.99), float(ratios.mean())

    def __repr__(self) -> str:
        return (f"HexAgentSearch(k={self.k}, oracle={self.oracle}, horizon={self.horizon!r}, "
                f"one_pass_threshold={self.one_pass_threshold}, knowledge={self.knowledge!r}, "
                f"max_backlog={self.max_backlog})")


class HexAgentSearchOracle(HexAgentSearch):
    """``hexagent-search-oracle``: :class:`HexAgentSearch` rolling out the true future."""

    def __init__(self, k: int = 4, horizon: str = "arrived", one_pass_threshold: int = 32,
                 max_backlog: int | None = MAX_BACKLOG) -> None:
        super().__init__(k, oracle=True, horizon=horizon, one_pass_threshold=one_pass_threshold,
                         max_backlog=max_backlog)


class HexAgentSearchRevealed(HexAgentSearch):
    """``hexagent-search-revealed``: :class:`HexAgentSearch` whose forks hold only the revealed
    calls (no workflow template: what HexAgent and the env's observation know)."""

    def __init__(self, k: int = 4, one_pass_threshold: int = 32,
                 max_backlog: int | None = MAX_BACKLOG) -> None:
        super().__init__(k, one_pass_threshold=one_pass_threshold, knowledge="revealed",
                         max_backlog=max_backlog)


class _Finished:
    """Whether every scored workflow (the first ``scored`` to arrive; None: the episode runs
    to its end) has finished, counted incrementally from the simulator's finish list."""

    def __init__(self, sim, scored: int | None) -> None:
        self.sim, self.scored = sim, scored
        self.seen = len(sim.finished)
        self.count = sum(1 for w in sim.finished if scored is not None and w.uid < scored)

    def all(self) -> bool:
        if self.scored is None:
            return False
        finished = self.sim.finished
        for w in finished[self.seen:]:
            if w.uid < self.scored:
                self.count += 1
        self.seen = len(finished)
        return self.count == self.scored


__all__ = ["HexAgentSearch", "HexAgentSearchOracle", "HexAgentSearchRevealed"]
