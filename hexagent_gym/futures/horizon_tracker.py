"""Keeping each shown workflow's forecast Ĥ_w current, and using it only where it has been
accurate (docs/horizons.md).

A forecast that cannot tell a workflow's future from another's does harm: on LATS every tree
declares the same application and first prompt, so a forecast lifts every young tree's risk
denominator to one number and removes HexAgent's preference for young trees, among them the
short ones. :class:`ForecastGate` therefore keeps, per application id, the log-RMSE of the
forecasts made for workflows that have finished (their true H_w is then known), seeded from
the predictor's warm-start estimate, and a forecast is written to ``Workflow.h_pred`` only for
applications whose error is within the gate, and for a workflow only while it exceeds the
workflow's running horizon by more than that error (:meth:`ForecastGate.use`). Everything it
reads is history: finished workflows, earlier in time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hexagent_gym.futures.horizon_predictors import HorizonPredictor, scopes, workflow_features

if TYPE_CHECKING:
    from hexagent_gym.planning.entities import Workflow

MIN_ROWS = 20
"""Forecasts an application needs on record before its own error decides the gate; below it,
its family's error decides, then every application's; with fewer than this many on record in
each, forecasts are used."""


class ForecastGate:
    """Per application id, whether forecasts have been accurate enough to use.

    Args:
        limit: the largest log-RMSE (per forecast, over finished workflows) at which an
            application's forecasts are used; None: always used.
        warm: scope (:func:`~hexagent_gym.futures.horizon_predictors.scopes`: application id,
            family, None for all) → (sum of squared log errors, forecasts), from the
            predictor's warm start (:meth:`HorizonPredictor.warm_errors`).
    """

    def __init__(self, limit: float | None,
                 warm: Mapping[str | None, tuple[float, int]] | None = None) -> None:
        self.limit = limit
        self._sq: dict[str | None, list[float]] = {k: [v[0], v[1]] for k, v in
                                                    (warm or {}).items()}
        self._trusted: dict[str, bool] = {}
        self._error: dict[str, float | None] = {}  # error(app) as of the last trusted(app)
        self.version = 0  # changes when an answer of :meth:`trusted` or :meth:`use` may have
        # changed (every record moves an application's error)

    def record(self, app_id: str, log_forecasts: Sequence[float], log_truth: float) -> None:
        """Score the forecasts made for a finished workflow against its true log H_w."""
        if not log_forecasts:
            return
        sq = sum((f - log_truth) ** 2 for f in log_forecasts)
        for key in scopes(app_id):
            s = self._sq.setdefault(key, [0.0, 0])
            s[0] += sq
            s[1] += len(log_forecasts)
        self._trusted.clear()
        self.version += 1

    def error(self, app_id: str) -> float | None:
        """The log-RMSE that decides for ``app_id``: its own, else its family's, else all
        applications' (:func:`scopes`), or None with fewer than :data:`MIN_ROWS` forecasts on
        record in each."""
        for key in scopes(app_id):
            s = self._sq.get(key)
            if s is not None and s[1] >= MIN_ROWS:
                return math.sqrt(s[0] / s[1])
        return None

    def use(self, app_id: str, h: float, h_est: float) -> float:
        """The forecast ``h`` to write to ``Workflow.h_pred`` (0.0: none) for a workflow of
        ``app_id`` whose running horizon is ``h_est``: ``h`` where the application is
        :meth:`trusted` and the forecast exceeds the running horizon by more than the
        application's own error (log(h / h_est) > :meth:`error`), else 0.0.

        Why the margin: near a workflow's end its running horizon is close to the truth, and a
        forecast that says only a little more is within its own error of it; using it there
        lowers the risk of a workflow that is nearly done (on Mixed at 10/s, the tail's short
        BFCL-v3 workflows) for no information. Where the running horizon is a small share of
        the forecast, early in a long workflow, the forecast is used as before.
        """
        if not self.trusted(app_id):
            return 0.0
        if self.limit is not None and h_est > 0.0 and h > 0.0:
            err = self._error[app_id]  # filled by trusted()
            if err is not None and math.log(h / h_est) <= err:
                return 0.0
        return h

    def all_trusted(self, workflows: Iterable[Workflow]) -> bool:
        """Whether every one of ``workflows`` belongs to a :meth:`trusted` application."""
        trusted = self.trusted
        return all(trusted(wf.spec.app_id) for wf in workflows)

    def trusted(self, app_id: str) -> bool:
        """Whether ``app_id``'s forecasts are used: its :meth:`error` is within the limit, or
        not yet known, or there is no limit."""
        hit = self._trusted.get(app_id)
        if hit is None:
            err = self._error[app_id] = None if self.limit is None else self.error(app_id)
            hit = self._trusted[app_id] = err is None or err <= self.limit
        return hit


class HorizonTracker:
    """Keeps ``Workflow.h_pred`` current for the workflows a decision shows (one per episode).

    At each :meth:`refresh` it first hands the predictor the workflows that finished since the
    last one (with the feature rows recorded for them) and scores the forecasts made for them
    (:class:`ForecastGate`), then predicts, in one batch, for the workflows among ``calls``
    whose progress (calls revealed, calls done) changed since their last forecast, or all of
    them when the predictor learned since (its ``version``). A row is recorded per workflow and
    progress step. Only finished workflows are ever learned from, and a workflow's rows are its
    state at decisions it took part in (what the scheduler saw). ``h_pred`` is the forecast
    where :meth:`ForecastGate.use` passes it, else 0.0 (no forecast).
    """

    def __init__(self, predictor: HorizonPredictor) -> None:
        self.predictor = predictor
        self.gate = ForecastGate(predictor.gate, predictor.warm_errors())
        self._seen_finished = 0
        self._progress: dict[int, tuple[int, int]] = {}
        self._latest: dict[int, list[float]] = {}  # each workflow's latest row
        self._version: dict[int, int] = {}  # predictor version of each workflow's forecast
        self._rows: dict[int, list[list[float]]] = {}
        self._issued: dict[int, list[float]] = {}  # log of every forecast made per workflow
        self._forecast: dict[int, float] = {}  # each workflow's latest forecast, gated or not
        self._gated: dict[int, int] = {}  # the gate version its h_pred was gated at

    def refresh(self, finished: Sequence[Workflow], calls: Sequence[Any]) -> None:
        """Learn from ``finished[seen:]``, then forecast the changed workflows of ``calls``."""
        predictor = self.predictor
        if len(finished) > self._seen_finished:
            self._learn(finished[self._seen_finished:])
            self._seen_finished = len(finished)
        progress, latest, versions = self._progress, self._latest, self._version
        version = predictor.version
        gate, gated, forecast = self.gate, self._gated, self._forecast
        gate_version = gate.version
        stale: list[tuple[Workflow, list[float]]] = []
        for c in calls:
            wf = c.workflow
            uid = wf.uid
            key = (wf.num_done, len(wf.open_calls))
            if progress.get(uid) != key:
                progress[uid] = key
                row = latest[uid] = workflow_features(wf, predictor.app_code(wf.spec.app_id))
                self._rows.setdefault(uid, []).append(row)
            elif versions.get(uid) != version:
                row = latest[uid]
            else:
                if gated[uid] != gate_version:  # the same forecast, judged again
                    gated[uid] = gate_version
                    wf.h_pred = gate.use(wf.spec.app_id, forecast[uid], wf.h_est)
                continue
            versions[uid] = version
            stale.append((wf, row))
        if stale:
            issued = self._issued
            for (wf, _), h in zip(stale, predictor.predict(stale), strict=True):
                uid = wf.uid
                if h > 0.0:
                    issued.setdefault(uid, []).append(math.log(h))
                forecast[uid] = h
                gated[uid] = gate_version
                wf.h_pred = gate.use(wf.spec.app_id, h, wf.h_est)

    def _learn(self, new: Sequence[Workflow]) -> None:
        rows = self._rows
        self.predictor.learn([(wf, rows.pop(wf.uid, [])) for wf in new])
        for wf in new:  # never shown again: keep the tracker's memory to running ones
            uid = wf.uid
            self._progress.pop(uid, None)
            self._latest.pop(uid, None)
            self._version.pop(uid, None)
            self._forecast.pop(uid, None)
            self._gated.pop(uid, None)
            issued = self._issued.pop(uid, None)
            if issued and wf.horizon > 0.0:
                self.gate.record(wf.spec.app_id, issued, math.log(wf.horizon))
