"""Workflow-horizon predictors: Ĥ_w, a forecast of a workflow's final standalone horizon H_w
from what a serving front end may know (docs/horizons.md).

HexAgent's running horizon H_w(t) covers the calls revealed so far, so early in a multi-turn
workflow it is a small fraction of H_w (the metric's denominator). A predictor forecasts H_w
from the workflow's declared identity (application id, first prompt), its progress (calls
revealed and done, H_w(t) itself) and the history of workflows that finished earlier in the
episode (their true H_w is the label). It never reads a workflow's unrevealed calls or true
output lengths, except ``oracle``, a bound.

Names (:data:`HORIZON_PREDICTORS`):

- ``none``: no forecast (Ĥ = 0, so ``max(H_w(t), Ĥ)`` is the paper's H_w(t));
- ``oracle``: the true final H_w (a bound, never a default);
- ``app-mean``: the geometric mean of the finished workflows' H_w with the same application
  id (else of all finished workflows; 0 before any finished);
- ``learned``: a LightGBM quantile regressor (the 0.1 quantile by default) of log H_w over
  :data:`FEATURES`, refitted online as
  finished workflows accumulate and optionally warm-started from a training split's episodes
  (:meth:`~hexagent_gym.episode.EpisodeFactory.horizon_rows`); ``app-mean`` answers until its
  first fit.

The simulator asks at decision points only (:class:`HorizonTracker`), for the workflows with
calls waiting whose progress changed, and writes the forecast to ``Workflow.h_pred``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hexagent_gym.config import suggest
from hexagent_gym.futures.lightgbm_rows import RowPredictor

if TYPE_CHECKING:
    from hexagent_gym.planning.entities import Workflow

HORIZON_PREDICTORS = ("none", "oracle", "app-mean", "learned")
FEATURES = ("app", "first_prompt_tokens", "source_calls", "revealed", "done", "h_running",
            "h_done")
"""What ``learned`` reads per workflow, in order: the application id (a category), the first
prompt's tokens and the number of calls visible at arrival (declared at arrival); calls revealed
and calls done, the running horizon H_w(t) and its part fixed by finished calls (progress)."""
UNKNOWN_APP = -1.0
DEFAULT_GATE = 0.7
"""``app-mean``'s and ``learned``'s default forecast gate: an application's forecasts are used
while their log-RMSE is at most this, typically within a factor e^0.7 ≈ 2 of the truth
(:class:`~hexagent_gym.futures.horizon_tracker.ForecastGate`; chosen on validation seeds:
docs/horizons.md)."""


def arrival_features(wf: Workflow, app_code: float) -> tuple[float, float, float]:
    """The first three :data:`FEATURES` of ``wf``, fixed from its arrival (``app_code``: its
    application's category code)."""
    spec = wf.spec
    sources = sum(1 for c in spec.calls if not c.parents)
    return app_code, float(spec.calls[0].input_tokens), float(sources)


def workflow_features(wf: Workflow, app_code: float,
                      arrival: tuple[float, float, float] | None = None) -> list[float]:
    """The :data:`FEATURES` row of ``wf`` now (``app_code``: its application's category code;
    ``arrival``: its :func:`arrival_features`, when kept)."""
    return [*(arrival or arrival_features(wf, app_code)), float(wf.num_done + len(wf.open_calls)),
            float(wf.num_done), wf.h_est, wf.h_est_done]


class HorizonPredictor:
    """``none``: no forecast. The base of every predictor: per-episode state is reset by
    :meth:`fresh`; :meth:`learn` takes finished workflows in finish order, each with the feature
    rows recorded while it ran; :meth:`predict` answers for (workflow, feature row) pairs."""

    name = "none"
    version = 0
    """Changes whenever :meth:`predict` may answer differently for the same rows (it learned):
    the tracker then forecasts every shown workflow again."""
    gate: float | None = None
    """The largest log-RMSE at which an application's forecasts are used (None: always)."""

    def warm_errors(self) -> dict[str | None, tuple[float, int]]:
        """What the warm start says of the forecasts' accuracy: application id (None: all) →
        (sum of squared log errors, rows). Empty without a warm start."""
        return {}

    def fresh(self) -> HorizonPredictor:
        """A copy for a new episode: warm-start knowledge kept, the episode's own dropped."""
        return self

    def app_code(self, app_id: str) -> float:
        """The category code of an application id (assigned in first-seen order)."""
        return UNKNOWN_APP

    def learn(self, finished: Sequence[tuple[Workflow, list[list[float]]]]) -> None:
        """Take workflows that finished (their ``horizon`` is the label)."""

    def predict(self, rows: Sequence[tuple[Workflow, list[float]]]) -> list[float]:
        """Ĥ in seconds per (workflow, feature row); 0.0 means no forecast."""
        return [0.0] * len(rows)

    def row_scorer(self) -> Callable[[list[float]], float] | None:
        """A function of one feature row alone whose ``math.exp`` is exactly what
        :meth:`predict` answers for it until the next :attr:`version`, where the predictor has
        one (a compiled model); else None."""
        return None


class OraclePredictor(HorizonPredictor):
    """The true final H_w: what a perfect predictor gives (a bound, not implementable)."""

    name = "oracle"

    def predict(self, rows: Sequence[tuple[Workflow, list[float]]]) -> list[float]:
        return [wf.horizon for wf, _ in rows]


class AppMeanPredictor(HorizonPredictor):
    """Online geometric mean of finished workflows' H_w per application id.

    Args:
        warm: (app id, H_w) pairs of a training split, counted before the episode's own.
    """

    name = "app-mean"

    def __init__(self, warm: Sequence[tuple[str, float]] = (), *,
                 gate: float | None = DEFAULT_GATE) -> None:
        self.gate = _check_gate(gate)
        self._warm = _log_sums(warm)
        self._sums = {k: list(v) for k, v in self._warm.items()}
        self._warm_errors: dict[str | None, tuple[float, int]] = {}
        if warm:  # in sample: one mean per application barely overfits
            _add_errors(self._warm_errors, [(app, math.log(self.estimate(app)), math.log(h))
                                            for app, h in warm if h > 0.0])

    def warm_errors(self) -> dict[str | None, tuple[float, int]]:
        return self._warm_errors

    def fresh(self) -> AppMeanPredictor:
        new = AppMeanPredictor.__new__(AppMeanPredictor)
        new.__dict__.update(self.__dict__)
        new._sums = {k: list(v) for k, v in self._warm.items()}
        return new

    def learn(self, finished: Sequence[tuple[Workflow, list[list[float]]]]) -> None:
        for wf, _ in finished:
            if wf.horizon > 0.0:
                _add(self._sums, wf.spec.app_id, math.log(wf.horizon))
                self.version += 1

    def estimate(self, app_id: str) -> float:
        """The geometric mean for ``app_id``, else over every application, else 0.0."""
        hit = self._sums.get(app_id) or self._sums.get(None)
        return math.exp(hit[0] / hit[1]) if hit else 0.0

    def predict(self, rows: Sequence[tuple[Workflow, list[float]]]) -> list[float]:
        return [self.estimate(wf.spec.app_id) for wf, _ in rows]


def _add(sums: dict[Any, list[float]], key: str, value: float) -> None:
    for k in (key, None):  # None: every application together
        s = sums.setdefault(k, [0.0, 0])
        s[0] += value
        s[1] += 1


def scopes(app_id: str) -> tuple[str | None, ...]:
    """Where an application's forecast errors are pooled, narrowest first: the application id,
    its family (the part before the first ``/``: ``bfcl_v3`` for ``bfcl_v3/simple``, the trace
    that declared it) when it has one, and None (every application)."""
    family, sep, _ = app_id.partition("/")
    return (app_id, family, None) if sep else (app_id, None)


def _add_errors(errors: dict[str | None, tuple[float, int]],
                scored: Sequence[tuple[str, float, float]]) -> None:
    """Add (application id, log forecast, log truth) triples to squared-error sums per scope
    (:func:`scopes`: application, family, all)."""
    for app, forecast, truth in scored:
        for key in scopes(app):
            sq, n = errors.get(key, (0.0, 0))
            errors[key] = (sq + (forecast - truth) ** 2, n + 1)


def _check_gate(gate: float | None) -> float | None:
    if gate is not None and not (isinstance(gate, (int, float)) and not isinstance(gate, bool)
                                 and math.isfinite(gate)
                                 and gate > 0.0):
        raise ValueError(f"gate must be a log-RMSE > 0 or None (always use forecasts), "
                         f"got {gate!r}")
    return None if gate is None else float(gate)


def _log_sums(pairs: Sequence[tuple[str, float]]) -> dict[Any, list[float]]:
    sums: dict[Any, list[float]] = {}
    for app, h in pairs:
        if h > 0.0:
            _add(sums, app, math.log(h))
    return sums


class LearnedPredictor(HorizonPredictor):
    """A LightGBM regressor of log H_w over :data:`FEATURES`, deterministic (one thread).

    Args:
        warm_rows: (app id, feature row without the app code, H_w) of a training split
            (:class:`RowCollector`, ``EpisodeFactory.horizon_rows``); fitted once here, kept by
            :meth:`fresh`.
        quantile: fit this quantile of log H_w (pinball loss); None: the mean (L2). The default,
            0.1, is a forecast the horizon exceeds nine times in ten: ``hexagent-horizon``
            raises a workflow's risk denominator above H_w(t) only that far, so a workflow that
            turns out short is rarely treated as long (docs/horizons.md: chosen on validation
            seeds, where the median hurt LATS).
        first_fit: without a warm model, the episode's finished workflows before its first fit
            (``app-mean`` answers until then).
        refit_growth: refit (on the warm rows plus the episode's own) once the training rows
            have grown by this fraction since the last fit: 1.0 refits at every doubling, so an
            online-only model is fitted at about 32, 64, 128, 256 finished workflows, while a
            warm-started one refits only when the episode has added as much as the warm start
            gave (each fit costs tens of ms; the forecasts it changes matter little then:
            docs/horizons.md).
        rounds, leaves, learning_rate, min_leaf: LightGBM's boosting rounds, leaves per tree,
            shrinkage and minimum rows per leaf.
        gate: the forecast gate (:data:`DEFAULT_GATE`; None: always use the forecasts). With
            warm rows, the gate's starting estimate of each application's error is cross-fitted:
            a model fitted on each half of the warm rows (cut between workflows) scores the
            other half.
    """

    name = "learned"

    def __init__(self, warm_rows: Sequence[tuple[str, list[float], float]] = (), *,
                 quantile: float | None = 0.1, first_fit: int = 32, refit_growth: float = 1.0,
                 rounds: int = 80, leaves: int = 15, learning_rate: float = 0.1,
                 min_leaf: int = 10, gate: float | None = DEFAULT_GATE) -> None:
        self.gate = _check_gate(gate)
        if quantile is not None and not 0.0 < quantile < 1.0:
            raise ValueError(f"quantile must be in (0, 1) or None (the mean), got {quantile!r}")
        if not isinstance(first_fit, int) or isinstance(first_fit, bool) or first_fit < 1:
            raise ValueError(f"first_fit must be a workflow count >= 1, got {first_fit!r}")
        if not (isinstance(refit_growth, (int, float)) and not isinstance(refit_growth, bool)
                and math.isfinite(refit_growth)
                and refit_growth > 0.0):
            raise ValueError(f"refit_growth must be a fraction > 0, got {refit_growth!r}")
        self.quantile = quantile
        self.first_fit = first_fit
        self.refit_growth = float(refit_growth)
        self.params = {"objective": "regression" if quantile is None else "quantile",
                       "num_leaves": leaves, "learning_rate": learning_rate,
                       "min_data_in_leaf": min_leaf, "num_threads": 1, "deterministic": True,
                       "force_row_wise": True, "verbose": -1, "seed": 0}
        if quantile is not None:
            self.params["alpha"] = quantile
        self.rounds = rounds
        self._codes: dict[str, float] = {}
        warm = [(app, row, h) for app, row, h in warm_rows if h > 0.0]
        self._warm_x = [[self.app_code(app), *row] for app, row, _ in warm]
        self._warm_y = [math.log(h) for _, _, h in warm]
        self._fallback = AppMeanPredictor([(app, h) for app, _, h in warm], gate=gate)
        self._warm_model = self._fit(self._warm_x, self._warm_y)
        self._warm_errors = (self._cross_fitted_errors([app for app, _, _ in warm])
                             if self._warm_model is not None and gate is not None else {})
        self._reset_episode()

    def _cross_fitted_errors(self, apps: list[str]) -> dict[str | None, tuple[float, int]]:
        x, y = self._warm_x, self._warm_y
        # RowCollector keeps a workflow's rows together: cut where the label changes
        cut = next((i for i in range(len(y) // 2, len(y)) if y[i] != y[i - 1]), len(y))
        errors: dict[str | None, tuple[float, int]] = {}
        for fit, score in ((slice(0, cut), slice(cut, None)), (slice(cut, None), slice(0, cut))):
            model = self._fit(x[fit], y[fit])
            if model is None or not x[score]:
                continue
            _add_errors(errors, list(zip(apps[score], model.predict(x[score]), y[score],
                                         strict=True)))
        return errors

    def warm_errors(self) -> dict[str | None, tuple[float, int]]:
        if self._model is None:
            return self._fallback.warm_errors()
        return self._warm_errors

    def _reset_episode(self) -> None:
        self._model = self._warm_model
        self._x: list[list[float]] = []
        self._y: list[float] = []
        self._finished = 0
        self._fitted_rows = len(self._warm_y) if self._warm_model is not None else 0
        self._episode_fallback = self._fallback.fresh()
        self.version = 0

    def fresh(self) -> LearnedPredictor:
        new = LearnedPredictor.__new__(LearnedPredictor)
        new.__dict__.update(self.__dict__)
        new._codes = dict(self._codes)
        new._reset_episode()
        return new

    def app_code(self, app_id: str) -> float:
        code = self._codes.get(app_id)
        if code is None:
            code = self._codes[app_id] = float(len(self._codes))
        return code

    def _fit(self, x: list[list[float]], y: list[float]) -> Any:
        if len(y) < 2 * self.params["min_data_in_leaf"]:
            return None
        import lightgbm  # only episodes that learn horizons pay for the import

        data = lightgbm.Dataset(np.asarray(x, dtype=np.float64), np.asarray(y),
                                categorical_feature=[0], free_raw_data=True,
                                params={"verbose": -1})
        return RowPredictor(lightgbm.train(self.params, data, num_boost_round=self.rounds),
                            len(FEATURES), x)

    def learn(self, finished: Sequence[tuple[Workflow, list[list[float]]]]) -> None:
        if self._model is None:  # the fallback answers until the first fit, and never after
            self._episode_fallback.learn(finished)
            self.version = self._episode_fallback.version
        for wf, rows in finished:
            if wf.horizon > 0.0:
                label = math.log(wf.horizon)
                self._x.extend(rows)
                self._y.extend([label] * len(rows))
        self._finished += len(finished)
        rows = len(self._warm_y) + len(self._y)
        due = (self._finished >= self.first_fit if self._fitted_rows == 0
               else rows >= self._fitted_rows * (1.0 + self.refit_growth))
        if due:
            model = self._fit(self._warm_x + self._x, self._warm_y + self._y)
            if model is not None:
                self._model = model
                self._fitted_rows = rows
                self.version += 1

    def predict(self, rows: Sequence[tuple[Workflow, list[float]]]) -> list[float]:
        if self._model is None:
            return self._episode_fallback.predict(rows)
        return self.predict_rows([r for _, r in rows])

    def row_scorer(self) -> Callable[[list[float]], float] | None:
        return None if self._model is None else self._model.scorer()

    def predict_rows(self, rows: Sequence[list[float]]) -> list[float]:
        """Ĥ in seconds per :data:`FEATURES` row, from the current model (one must exist)."""
        # the raw score is the prediction for both objectives (identity link); rows come one
        # workflow at a time, so LightGBM's one-row fast path (lightgbm_rows) answers them
        return [math.exp(v) for v in self._model.predict(rows)]


def make_horizon_predictor(name: str, warm: Mapping[str, Any] | None = None,
                           **params: Any) -> HorizonPredictor:
    """A predictor by name (:data:`HORIZON_PREDICTORS`).

    Args:
        name: the predictor.
        warm: training-split data for ``app-mean`` and ``learned`` (``{"rows": [...]}``, rows
            as :class:`RowCollector` keeps them); None: online only.
        **params: ``learned``'s keyword arguments (:class:`LearnedPredictor`); ``app-mean``
            takes ``gate``.

    Raises:
        ValueError: unknown name (with the closest known one), or parameters the predictor
            does not take.
    """
    rows = list((warm or {}).get("rows", ()))
    if name not in HORIZON_PREDICTORS:
        raise ValueError(f"unknown horizon predictor {name!r}; known: "
                         f"{', '.join(HORIZON_PREDICTORS)}.{suggest(name, HORIZON_PREDICTORS)}")
    takes = {"none": set(), "oracle": set(), "app-mean": {"gate"}}.get(name)
    if takes is not None and set(params) - takes:
        raise ValueError(f"the {name} horizon predictor takes "
                         f"{', '.join(sorted(takes)) or 'no parameters'}, got "
                         f"{', '.join(sorted(params))}")
    if name == "none":
        return HorizonPredictor()
    if name == "oracle":
        return OraclePredictor()
    if name == "app-mean":
        return AppMeanPredictor([(app, h) for app, _, h in rows], **params)
    try:
        return LearnedPredictor(rows, **params)
    except TypeError as exc:
        raise ValueError(f"learned horizon predictor: {exc}") from None


class RowCollector(HorizonPredictor):
    """No forecast; keeps every finished workflow's rows as training data (app id, feature row
    without its app code, H_w): run episodes of a training split with it to warm-start
    ``app-mean`` and ``learned`` (``EpisodeFactory.horizon_predictor``)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, list[float], float]] = []

    def learn(self, finished: Sequence[tuple[Workflow, list[list[float]]]]) -> None:
        for wf, rows in finished:
            self.rows.extend((wf.spec.app_id, row[1:], wf.horizon) for row in rows)


def offline_error(train: Sequence[tuple[str, list[float], float]],
                  test: Sequence[tuple[str, list[float], float]],
                  quantiles: Sequence[float] = (0.1, 0.5, 0.9),
                  **params: Any) -> dict[str, float]:
    """Offline accuracy of the forecasts: fit on ``train`` rows, score on ``test`` rows (both
    as :class:`RowCollector` keeps them, e.g. the train and eval halves of a trace).

    Returns:
        ``rmse_running``, ``rmse_app_mean``, ``rmse_learned``: log-RMSE of H_w(t) itself, of
        ``app-mean`` and of ``learned`` (median) against the true log H_w; and per quantile q
        ``coverage_<q>``: the share of test rows whose true H_w is at most ``learned``'s q-quantile
        forecast (calibrated: about q). ``rows``: the number of test rows.
    """

    truth = np.log([h for _, _, h in test])

    def rmse(forecast: Sequence[float]) -> float:
        return float(np.sqrt(np.mean((np.log(np.maximum(forecast, 1e-9)) - truth) ** 2)))

    app_mean = AppMeanPredictor([(app, h) for app, _, h in train])
    out = {"rows": float(len(test)),
           "rmse_running": rmse([row[4] for _, row, _ in test]),  # h_running (rows hold no app)
           "rmse_app_mean": rmse([app_mean.estimate(app) for app, _, _ in test])}
    for q in sorted({0.5, *quantiles}):
        model = LearnedPredictor(train, quantile=q, **params)
        if model._warm_model is None:
            raise ValueError(f"too few training rows to fit ({len(train)})")
        pred = np.log(model.predict_rows([[model.app_code(a), *r] for a, r, _ in test]))
        if q == 0.5:
            out["rmse_learned"] = float(np.sqrt(np.mean((pred - truth) ** 2)))
        if q in quantiles:
            out[f"coverage_{q:g}"] = float(np.mean(truth <= pred))
    return out
