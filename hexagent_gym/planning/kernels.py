"""Which implementation of the hot rules runs: compiled or pure Python.

``hexagent_gym.planning._kernels`` (C, built by ``pip install`` when a C compiler is present,
against numpy's headers) holds compiled twins of the hottest scalar rules of the decision seam and
of the env observation's assembly (``hexagent_gym.envs.encoding``); each performs the same IEEE
double operations in the same order as its Python original, so every decision and every float
is the same either way (the tests compare the two on every pick of real episodes). Without a
compiler the package installs without it and runs the Python versions.

Set the environment variable ``HEXAGENT_GYM_PURE_PYTHON=1`` before importing the package to run
the Python versions although the compiled ones are built (for A/B timings and the equality
tests); :func:`use_compiled` switches at run time.
"""

from __future__ import annotations

import os

try:
    from hexagent_gym.planning import _kernels as _compiled
except ImportError:  # built without a C compiler: the Python versions run
    _compiled = None

AVAILABLE = _compiled is not None
"""Whether the compiled kernels were built and import."""

best_prefill_pairs = None
"""The compiled ``Projections.best_prefill_pair_one_python`` for several calls of one window in
one call (``Projections.best_prefill_pairs``), or None: the Python rule runs."""

prefill_grid = None
"""The compiled ``Projections.prefill_delta_one`` for several calls of one window in one call,
written into a float64 (n, P, D) array (``Projections.prefill_grid``), or None."""

decode_scan = None
"""The compiled ``placement.decode_scan_python`` (arguments: the tables' ``dec_kind`` and the
decode lists), or None."""

prefill_free_times = None
"""The compiled ``entities.prefill_free_times_python``, or None."""

commit_prefill_picks = None
"""The compiled loop of ``PlanState.commit_prefill_picks`` (its Python loop is the reference),
or None."""

decode_limits = None
"""The compiled ``plan_state.decode_limits_python``, or None."""

earliest_pair = None
"""The compiled ``placement.earliest_pair_python`` (the fallback's placement rule), or None."""

match_levels = None
"""The compiled ``prefix_cache.match_levels_python`` (masks up to 64 bits; None from the
kernel means wider masks, and the Python version runs), or None."""

decode_cells = None
"""The compiled ``Projections.decode_delta_one`` for decode-stage calls no decode limit binds
(``DecisionPoint._scalar_decode_delta``), or None."""

standalone_estimate = None
"""The compiled ``ClusterTables.standalone_estimate_python``, or None."""

cache_lock = None
"""The compiled ``prefix_cache.PrefixCache.lock`` (its Python body is the reference), or None."""

cache_insert = None
"""The compiled ``prefix_cache.PrefixCache._insert_python`` up to each block that needs an
eviction (the Python method evicts and calls it again), or None."""

cache_unlock = None
"""The compiled ``prefix_cache.PrefixCache.unlock`` (its Python body is the reference), or None."""

risk_plan = None
"""The compiled twin of ``hexagent_gym.agents.hexagent``'s ranking of a prefill window
(``DecisionPoint.risk_plan``), or None."""

begin_rows = None
"""The env observation's per-decision features (call rows, cache-hit fractions, instance
queues and batches), compiled (``hexagent_gym.envs.encoding._begin_rows_python``, same values),
or None."""

observe_step = None
"""The env's whole observation of a decision point (the Δ grid and joint mask, the per-step
columns, fresh arrays from the per-decision templates), compiled
(``hexagent_gym.envs.encoding.Encoder.
observe``'s numpy and list code, same values), or None."""

forecast_stale = None
"""The compiled ``horizon_tracker.forecast_stale_python`` (which shown workflows a horizon
forecast must judge again), or None."""

ensemble_score = None
"""The raw score of a LightGBM model for one row, from ``lightgbm_rows.flatten_booster``'s
block (the same score as LightGBM's own; ``RowPredictor`` checks it), or None."""


def use_compiled(on: bool) -> None:
    """Run the compiled kernels (``on``, if built) or the pure-Python rules from now on."""
    global best_prefill_pairs, prefill_grid, decode_scan, prefill_free_times, decode_limits
    global observe_step, risk_plan, match_levels, earliest_pair, begin_rows
    global cache_lock, cache_insert, cache_unlock, standalone_estimate, decode_cells
    global commit_prefill_picks, forecast_stale, ensemble_score
    on = bool(on and AVAILABLE)
    best_prefill_pairs = _compiled.best_prefill_pairs if on else None
    prefill_grid = _compiled.prefill_grid if on else None
    decode_scan = _compiled.decode_scan if on else None
    prefill_free_times = _compiled.prefill_free_times if on else None
    commit_prefill_picks = _compiled.commit_prefill_picks if on else None
    decode_limits = _compiled.decode_limits if on else None
    observe_step = _compiled.observe_step if on else None
    begin_rows = _compiled.begin_rows if on else None
    risk_plan = _compiled.risk_plan if on else None
    match_levels = _compiled.match_levels if on else None
    cache_lock = _compiled.cache_lock if on else None
    standalone_estimate = _compiled.standalone_estimate if on else None
    decode_cells = _compiled.decode_cells if on else None
    cache_insert = _compiled.cache_insert if on else None
    cache_unlock = _compiled.cache_unlock if on else None
    earliest_pair = _compiled.earliest_pair if on else None
    forecast_stale = _compiled.forecast_stale if on else None
    ensemble_score = _compiled.ensemble_score if on else None


use_compiled(os.environ.get("HEXAGENT_GYM_PURE_PYTHON", "") in ("", "0"))

__all__ = ["AVAILABLE", "begin_rows", "best_prefill_pairs", "cache_insert", "cache_lock",
           "cache_unlock", "commit_prefill_picks", "decode_cells", "decode_limits", "decode_scan",
           "earliest_pair", "ensemble_score", "forecast_stale", "match_levels", "observe_step",
           "prefill_free_times", "prefill_grid", "risk_plan", "standalone_estimate",
           "use_compiled"]
