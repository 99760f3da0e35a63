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

from typing import Any

import numpy as np

from hexagent_gym.agents.base import BasePolicy
from hexagent_gym.futures.horizon_predictors import make_horizon_predictor
from hexagent_gym.futures.horizon_tracker import HorizonTracker
from hexagent_gym.planning.decisions import DecisionPoint, Stage


def projected_risk(dp: DecisionPoint, best: np.ndarray | None = None,
                   horizons: np.ndarray | None = None) -> np.ndarray:
    """R(c) for every slot of ``dp`` (picked slots get −inf) from each slot's smallest Δ
    ``best`` (n,) (default ``dp.min_delta``, under the current Ŝ) and each slot's horizon
    ``horizons`` (n,) (default: its workflow's running horizon H_w(t), the paper's rule)."""
    if best is None:
        best = dp.min_delta
    batch = dp.batch
    risk = ((dp.now - batch.arrival) + best) / (batch.h_est if horizons is None else horizons)
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
        (``dp.follow_plan``), else that pick and whatever plan follows it; above
        ``one_pass_threshold`` calls, the one-pass ordering's picks in one loop
        (``dp.pick_in_order``). The simulator asks :meth:`pick` for any calls left. A subclass
        with its own ``pick`` (another placement or lookahead) is left to it: its picks may
        leave the plan anywhere.
        """
        if type(self).pick is not HexAgentPolicy.pick:
            return
        first = self.pick(dp)
        planned = dp.planned_pick()
        if planned is None or planned[:3] != first:  # else follow_plan makes it with the rest
            dp.pick(*first)
        if dp is self._dp:  # a one-pass ordering: the rest of it in one loop
            self._next += dp.pick_in_order(self._order[self._next:])
        else:
            dp.follow_plan()

    def _ahead_pick(self, dp: DecisionPoint) -> tuple[int, int, int] | None:
        """This pick from the compiled twin of this policy's ranking (``dp.risk_plan``, asked
        once per decision at its first pick) while every pick made so far followed it; None:
        rank in Python (the twin stopped early, a pick left its plan, or none was asked)."""
        if dp is not self._plan_of:
            self._plan_of = dp
            if not dp.plan:
                dp.risk_plan(self.horizons(dp))
        planned = dp.planned_pick()
        return None if planned is None else planned[:3]

    def _riskiest(self, dp: DecisionPoint) -> int:
        """``argmax(projected_risk(dp))`` over a short window in scalar Python: the same IEEE
        operations on the same floats, and the first slot of the largest risk, as numpy's."""
        if dp is not self._inputs_of:
            self._inputs_of = dp
            self._arrival = [c.workflow.arrival for c in dp.calls]
            # as CallBatch.h_est: at the decision's first ranking (nothing changes a horizon
            # while a decision is open)
            self._h_est = self.horizons(dp) or [c.workflow.h_est for c in dp.calls]
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

    def horizons(self, dp: DecisionPoint) -> list[float] | None:
        """The risk's denominator per slot of ``dp``; None: each workflow's running horizon
        H_w(t) (``h_est``), the paper's rule. Constant while a decision is open."""
        return None

    def _horizon_array(self, dp: DecisionPoint) -> np.ndarray | None:
        h = self.horizons(dp)
        return None if h is None else np.asarray(h, dtype=np.float64)

    def _numpy_riskiest(self, dp: DecisionPoint) -> int:
        with np.errstate(divide="ignore", invalid="ignore"):
            return int(np.argmax(projected_risk(dp, horizons=self._horizon_array(dp))))

    def _one_pass_slot(self, dp: DecisionPoint) -> int:
        if dp is not self._dp:
            self._dp = dp
            self._order = self._one_pass_order(dp)
            self._next = 0
        slot = self._order[self._next]
        self._next += 1
        return slot

    def _one_pass_order(self, dp: DecisionPoint) -> list[int]:
        """``np.argsort(-projected_risk(dp), kind="stable")`` in scalar Python over
        ``dp.min_delta_values()`` (compiled at the prefill stage: no numpy arrays of the window):
        the same IEEE operations on the same floats, and a stable sort on the same keys. Numpy
        where a risk is undefined (a zero horizon or NaN, which Python would raise on or could
        not order as numpy does)."""
        now, calls, picked = dp.now, dp.calls, dp.picked
        h_est = self.horizons(dp) or [c.workflow.h_est for c in calls]
        keys = []
        for i, best in enumerate(dp.min_delta_values()):
            if picked[i]:
                keys.append(np.inf)  # −(−inf): projected_risk's picked slots sort last
                continue
            h = h_est[i]
            if h == 0.0:
                return self._numpy_order(dp)
            risk = ((now - calls[i].workflow.arrival) + best) / h
            if risk != risk:
                return self._numpy_order(dp)
            keys.append(-risk)
        return sorted(range(len(keys)), key=keys.__getitem__)

    def _numpy_order(self, dp: DecisionPoint) -> list[int]:
        risk = projected_risk(dp, horizons=self._horizon_array(dp))
        return np.argsort(-risk, kind="stable").tolist()

    def __repr__(self) -> str:
        extra = "" if self.cache_aware else ", cache_aware=False"
        return f"HexAgentPolicy(one_pass_threshold={self.one_pass_threshold}{extra})"


class HexAgentHorizon(HexAgentPolicy):
    """HexAgent whose risk divides by ``max(H_w(t), Ĥ_w)``: the running horizon of the revealed
    calls, or the forecast of the workflow's final horizon when that is longer
    (``hexagent-horizon``; docs/horizons.md).

    Early in a multi-turn workflow H_w(t) is a fraction of the final H_w, which inflates its
    risk and, under long queues, pushes long workflows ahead of short ones. Ĥ_w comes from a
    horizon predictor that sees only what a front end sees (application id, first prompt,
    progress, finished workflows' horizons). The max keeps the paper's rule wherever the
    forecast is shorter than what is already revealed. A decision that shows a workflow of an
    application the forecast gate does not trust ranks every workflow by its running horizon
    (one scale per decision: risks over forecasts and over running horizons do not compare).

    Args:
        predictor: None: the episode's forecasts (``Workflow.h_pred``, written by the
            simulator for ``horizon_predictor`` in the episode config). A name
            (``hexagent_gym.futures.horizon_predictors``: ``app-mean``, ``learned``, ``oracle``):
            this policy's own predictor, learning online within the episode only (no warm start),
            for episodes configured without one.
        predictor_params: ``learned``'s parameters (with ``predictor``).
        one_scale: rank a decision that shows an untrusted application's workflow by running
            horizons only (the default). False: each workflow by its own max(H_w(t), Ĥ_w)
            whatever the gate says of the others; the teacher of the learned scheduler
            (docs/learned_futures.md: trained on the one-scale rule, the network never sees the
            forecast used and learns to ignore it).
        one_pass_threshold, cache_aware: as :class:`HexAgentPolicy`.
    """

    name = "hexagent-horizon"

    def __init__(self, predictor: str | None = None,
                 predictor_params: dict[str, Any] | None = None, one_scale: bool = True,
                 one_pass_threshold: int = 32, cache_aware: bool = True) -> None:
        super().__init__(one_pass_threshold, cache_aware)
        if not isinstance(one_scale, bool):
            raise ValueError(f"one_scale must be true or false, got {one_scale!r}")
        self.one_scale = one_scale
        self.predictor = predictor
        self.predictor_params = dict(predictor_params or {})
        if predictor is None and self.predictor_params:
            raise ValueError("predictor_params needs predictor (a name)")
        self._own = (None if predictor is None
                     else make_horizon_predictor(predictor, **self.predictor_params))
        self._tracker: HorizonTracker | None = None
        self._sim = None
        self._horizons_of: DecisionPoint | None = None
        self._horizons: list[float] = []

    def reset(self, sim) -> None:
        super().reset(sim)
        self._sim = sim
        self._horizons_of = None
        self._tracker = None
        if self._own is not None:
            if sim.horizon_tracker is not None:
                raise ValueError(
                    f"hexagent-horizon(predictor={self.predictor!r}) would forecast over the "
                    f"episode's own '{sim.horizon_tracker.predictor.name}' predictor: drop the "
                    "policy's predictor argument or the episode's horizon_predictor")
            self._tracker = HorizonTracker(self._own.fresh())

    def horizons(self, dp: DecisionPoint) -> list[float] | None:
        if dp is not self._horizons_of:
            self._horizons_of = dp
            if self._tracker is not None:
                self._tracker.refresh(self._sim.finished, dp.calls)
            shown = [c.workflow for c in dp.calls]
            tracker = self._tracker if self._tracker is not None else self._sim.horizon_tracker
            if (self.one_scale and tracker is not None
                    and not tracker.gate.all_trusted(shown)):
                # one scale per decision: a workflow the gate leaves to its running horizon has
                # its early risk inflated, one ranked by its forecast has not, and compared on
                # the two scales the forecast ones lose every time (docs/horizons.md)
                self._horizons = [w.h_est for w in shown]
            else:
                self._horizons = [max(w.h_est, w.h_pred) for w in shown]
        return self._horizons

    def __repr__(self) -> str:
        return f"HexAgentHorizon(predictor={self.predictor!r})"


class HexAgentNoCache(HexAgentPolicy):
    """HexAgent planning with cache-oblivious prefill estimates (``hexagent-nocache``)."""

    name = "hexagent-nocache"

    def __init__(self, one_pass_threshold: int = 32) -> None:
        super().__init__(one_pass_threshold, cache_aware=False)
