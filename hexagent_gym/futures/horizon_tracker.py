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
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hexagent_gym.futures.horizon_predictors import (
    HorizonPredictor,
    arrival_features,
    scopes,
    workflow_features,
)
from hexagent_gym.planning import kernels

if TYPE_CHECKING:
    from hexagent_gym.planning.entities import Workflow

MIN_ROWS = 20
"""Forecasts an application needs on record before its own error decides the gate; below it,
its family's error decides, then every application's; with fewer than this many on record in
each, forecasts are used."""


def forecast_stale_python(calls: Sequence[Any], epoch: int) -> list[int]:
    """The indices of ``calls`` whose workflow must be judged again, in order, their
    ``forecast_stamp`` set (a workflow shown twice is listed once). A workflow's key is
    ``progress + 2**32 * epoch`` with progress = 2 * calls done + calls open (a reveal or a
    finish raises it by one); both parts only grow, so a key differs from the stamp exactly when
    the workflow progressed, the epoch moved, or the tracker cleared the stamp (-1: its
    application's judgement moved). ``kernels.forecast_stale`` is its compiled twin."""
    stale = []
    high = epoch << 32
    for i, c in enumerate(calls):
        wf = c.workflow
        key = 2 * wf.num_done + len(wf.open_calls) + high
        if wf.forecast_stamp != key:
            wf.forecast_stamp = key
            stale.append(i)
    return stale


def log_ratio(h: float, h_est: float) -> float | None:
    """log(h / h_est), the forecast's margin over the running horizon; None where either is
    0.0 (no forecast, or nothing revealed yet: no margin applies)."""
    return math.log(h / h_est) if h_est > 0.0 and h > 0.0 else None


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
        self.judgement: dict[str, tuple[bool, float | None]] = {}
        """Per application id judged since its last change: (:meth:`trusted`, the error the
        margin of :meth:`use` compares with: :meth:`error`, None without a limit); filled by
        :meth:`judge`."""
        self._read: dict[str, tuple[str | None, ...]] = {}  # the scopes each judgement read
        self._scopes: dict[str, tuple[str | None, ...]] = {}  # per app, :func:`scopes`
        self._readers: dict[str | None, set[str]] = {}  # scope → the judged apps that read it
        self._ratios: dict[str, list[float]] = {}  # per app, the watched ratios, sorted
        self.app_version: dict[str, int] = {}
        """Per application id, a count that grows whenever a forecast gated for it may be gated
        differently: a record moved its trust, or moved its error across the margin of a
        forecast in use (:meth:`watch`); absent: 0. Forecasts not watched (none made since)
        are gated afresh when made."""
        self.moved: set[str] = set()
        """The application ids whose :attr:`app_version` grew since the owner last cleared
        this set (:class:`HorizonTracker` judges their shown workflows again)."""

    def record(self, app_id: str, log_forecasts: Sequence[float], log_truth: float) -> None:
        """Score the forecasts made for a finished workflow against its true log H_w."""
        if not log_forecasts:
            return
        sq = sum((f - log_truth) ** 2 for f in log_forecasts)
        n = len(log_forecasts)
        touched = self._scopes.get(app_id) or self._scopes.setdefault(app_id, scopes(app_id))
        sums = self._sq
        for key in touched:
            s = sums.get(key)
            if s is None:
                s = sums[key] = [0.0, 0]
            s[0] += sq
            s[1] += n
        # only the applications whose judgement read a scope this record moved are judged
        # again, and their version grows only where a gated answer changes: the trust flips,
        # or the error crosses the margin of a forecast in use (:meth:`watch`)
        readers, read = self._readers, self._read
        moved: set[str] = set()
        for key in touched:
            apps = readers.get(key)
            if apps:
                moved |= apps
        judgement, versions, limit = self.judgement, self.app_version, self.limit
        for app in sorted(moved) if len(moved) > 1 else moved:
            # what judge() answers, sooner where the same scopes still decide (nothing to
            # register again); an application decided by its own errors stays so
            was, scopes_read = judgement[app], read[app]
            if scopes_read == (app,):
                s = sums[app]
                err = math.sqrt(s[0] / s[1])
                now = judgement[app] = (err <= limit, err)
            elif (found := self._deciding(app))[1] == scopes_read:
                err = found[0]
                now = judgement[app] = (err is None or err <= limit, err)
            else:
                for key in read.pop(app):
                    readers[key].discard(app)
                del judgement[app]
                now = self.judge(app)
            if was != now and (was[0] != now[0] or (now[0] and self._crossed(app, was[1],
                                                                              now[1]))):
                versions[app] = versions.get(app, 0) + 1
                self.moved.add(app)

    def watch(self, app_id: str, old: float | None, new: float | None) -> None:
        """A forecast of ``app_id`` in use changed its :func:`log_ratio` from ``old`` to ``new``
        (None: none); :meth:`record` compares the error's moves with the ratios watched."""
        ratios = self._ratios.setdefault(app_id, [])
        if old is not None and old == old:
            del ratios[bisect_left(ratios, old)]
        if new is not None and new == new:  # NaN compares with no error: never gated by it
            insort(ratios, new)

    def _crossed(self, app_id: str, was: float | None, now: float | None) -> bool:
        """Whether a watched ratio r of ``app_id`` has (r <= was) != (r <= now): one in
        (min, max] of the two errors (None: no margin, below every ratio)."""
        lo, hi = sorted((-math.inf if was is None else was, -math.inf if now is None else now))
        ratios = self._ratios.get(app_id, ())
        i = bisect_right(ratios, lo)
        return i < len(ratios) and ratios[i] <= hi

    def error(self, app_id: str) -> float | None:
        """The log-RMSE that decides for ``app_id``: its own, else its family's, else all
        applications' (:func:`scopes`), or None with fewer than :data:`MIN_ROWS` forecasts on
        record in each."""
        return self._deciding(app_id)[0]

    def _deciding(self, app_id: str) -> tuple[float | None, tuple[str | None, ...]]:
        """(:meth:`error`, the scopes read to find it: up to the one that decides)."""
        all_scopes = self._scopes.get(app_id) or self._scopes.setdefault(app_id, scopes(app_id))
        for i, key in enumerate(all_scopes):
            s = self._sq.get(key)
            if s is not None and s[1] >= MIN_ROWS:
                return math.sqrt(s[0] / s[1]), all_scopes[:i + 1]
        return None, all_scopes

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
        return gated(self.judgement.get(app_id) or self.judge(app_id), h, log_ratio(h, h_est))

    def all_trusted(self, workflows: Iterable[Workflow]) -> bool:
        """Whether every one of ``workflows`` belongs to a :meth:`trusted` application."""
        trusted = self.trusted
        return all(trusted(wf.spec.app_id) for wf in workflows)

    def trusted(self, app_id: str) -> bool:
        """Whether ``app_id``'s forecasts are used: its :meth:`error` is within the limit, or
        not yet known, or there is no limit."""
        return (self.judgement.get(app_id) or self.judge(app_id))[0]

    def judge(self, app_id: str) -> tuple[bool, float | None]:
        """Judge ``app_id`` now and keep the answer in :attr:`judgement` until a record moves
        a scope it read."""
        if self.limit is None:  # always used, whatever is recorded
            err, read = None, ()
        else:
            err, read = self._deciding(app_id)
        self._read[app_id] = read
        readers = self._readers
        for key in read:
            apps = readers.get(key)
            if apps is None:
                readers[key] = {app_id}
            else:
                apps.add(app_id)
        verdict = self.judgement[app_id] = (err is None or err <= self.limit, err)
        return verdict


def gated(verdict: tuple[bool, float | None], h: float, ratio: float | None) -> float:
    """:meth:`ForecastGate.use` of forecast ``h`` whose :func:`log_ratio` is ``ratio``, given
    its application's :attr:`ForecastGate.judgement` (so that a forecast judged again after the
    gate moved costs no logarithm)."""
    trusted, err = verdict
    if not trusted:
        return 0.0
    if ratio is not None and err is not None and ratio <= err:
        return 0.0
    return h


class _Tracked:
    """What the tracker keeps of one running workflow it has shown."""

    __slots__ = ("arrival", "progress", "version", "row", "rows", "issued", "h", "ratio")

    def __init__(self, arrival: tuple[float, float, float]) -> None:
        self.arrival = arrival  # its arrival_features
        self.progress = -1  # the progress its latest row was taken at (forecast_stale_python)
        self.version = -1  # the predictor version of its latest forecast
        self.row: list[float] = []  # its latest row
        self.rows: list[list[float]] = []  # one per progress step it was shown at
        self.issued: list[float] = []  # log of every forecast made (> 0)
        self.h = 0.0  # its latest forecast, gated or not
        self.ratio: float | None = None  # log_ratio of that forecast


class HorizonTracker:
    """Keeps ``Workflow.h_pred`` current for the workflows a decision shows (one per episode).

    At each :meth:`refresh` it first hands the predictor the workflows that finished since the
    last one (with the feature rows recorded for them) and scores the forecasts made for them
    (:class:`ForecastGate`), then predicts, in one batch, for the workflows among ``calls``
    whose progress (calls revealed, calls done) changed since their last forecast, or all of
    them when the predictor learned since (its ``version``). A row is recorded per workflow and
    progress step. Only finished workflows are ever learned from, and a workflow's rows are its
    state at decisions it took part in (what the scheduler saw). ``h_pred`` is the forecast
    where :meth:`ForecastGate.use` passes it, else 0.0 (no forecast), judged again when its
    application's judgement moves across its margin.
    """

    def __init__(self, predictor: HorizonPredictor) -> None:
        self.predictor = predictor
        self.gate = ForecastGate(predictor.gate, predictor.warm_errors())
        self._seen_finished = 0
        self._tracked: dict[int, _Tracked] = {}
        # Why a stamp: most shown workflows are unchanged since the decision before, and a
        # comparison with the key kept on each shown workflow (forecast_stale) tells them
        # apart; the epoch counts the predictor's versions (a new model forecasts every
        # workflow again), and a moved judgement clears the stamps of its application's
        # workflows (per application id: uid -> workflow, the tracked ones)
        self._model_version = predictor.version
        self._epoch = 0
        self._by_app: dict[str, dict[int, Workflow]] = {}
        self._score = predictor.row_scorer()

    def refresh(self, finished: Sequence[Workflow], calls: Sequence[Any]) -> None:
        """Learn from ``finished[seen:]``, then forecast the changed workflows of ``calls``."""
        # this runs at every decision point (about six per simulated call under load), so the
        # path where nothing changed is kept to a length check and the stale test
        if len(finished) > self._seen_finished:
            self._learn(finished[self._seen_finished:])
            self._seen_finished = len(finished)
            if self.predictor.version != self._model_version:  # versions move by learning only
                self._model_version = self.predictor.version
                self._epoch += 1
                self._score = self.predictor.row_scorer()
            moved = self.gate.moved
            if moved:  # their workflows' forecasts are gated again when next shown
                for app in moved:
                    for wf in self._by_app.get(app, {}).values():
                        wf.forecast_stamp = -1
                moved.clear()
        changed = (kernels.forecast_stale or forecast_stale_python)(calls, self._epoch)
        if not changed:  # most decisions: nothing shown has moved since it was last judged
            return
        predictor, version, gate = self.predictor, self._model_version, self.gate
        tracked, judgement = self._tracked, gate.judgement
        score, exp = self._score, math.exp  # score: HorizonPredictor.row_scorer, or None
        made: list[tuple[Workflow, _Tracked, float]] = []  # forecasts, scored as rows are made
        stale: list[tuple[Workflow, list[float]]] = []  # else asked of predict() together
        kept: list[tuple[Workflow, _Tracked]] = []
        for i in changed:
            wf = calls[i].workflow
            t = tracked.get(wf.uid)
            if t is None:
                app = wf.spec.app_id
                t = tracked[wf.uid] = _Tracked(arrival_features(wf, predictor.app_code(app)))
                by_app = self._by_app.get(app)
                if by_app is None:
                    by_app = self._by_app[app] = {}
                by_app[wf.uid] = wf
            progress = 2 * wf.num_done + len(wf.open_calls)
            if t.progress != progress:
                t.progress = progress
                t.row = workflow_features(wf, 0.0, t.arrival)
                t.rows.append(t.row)
            elif t.version == version:  # its application's judgement moved: judged again
                app = wf.spec.app_id
                wf.h_pred = gated(judgement.get(app) or gate.judge(app), t.h, t.ratio)
                continue
            t.version = version
            if score is not None:
                made.append((wf, t, exp(score(t.row))))
            else:
                stale.append((wf, t.row))
                kept.append((wf, t))
        if stale:
            made = [(wf, t, h) for (wf, t), h in zip(kept, predictor.predict(stale), strict=True)]
        log = math.log
        for wf, t, h in made:
            h_est = wf.h_est
            if h > 0.0:
                t.issued.append(log(h))
                r = log(h / h_est) if h_est > 0.0 else None  # log_ratio(h, h_est)
            else:
                r = None
            app = wf.spec.app_id
            gate.watch(app, t.ratio, r)
            t.h, t.ratio = h, r
            wf.h_pred = gated(judgement.get(app) or gate.judge(app), h, r)

    def _learn(self, new: Sequence[Workflow]) -> None:
        tracked = self._tracked
        gone = [tracked.pop(wf.uid, None) for wf in new]  # never shown again
        self.predictor.learn([(wf, [] if t is None else t.rows)
                              for wf, t in zip(new, gone, strict=True)])
        for wf, t in zip(new, gone, strict=True):
            if t is None:
                continue
            del self._by_app[wf.spec.app_id][wf.uid]
            self.gate.watch(wf.spec.app_id, t.ratio, None)
            if t.issued and wf.horizon > 0.0:
                self.gate.record(wf.spec.app_id, t.issued, math.log(wf.horizon))
