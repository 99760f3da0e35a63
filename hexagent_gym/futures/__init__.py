"""Forecasts of what is not known yet: calls' output lengths (``predictors``) and each
workflow's final horizon Ĥ_w (``horizon_predictors``, written at decision points by
``horizon_tracker``; the learned one's feature rows in ``lightgbm_rows``). Imports
``config`` and ``planning`` (the entities it reads); never the engine.
"""
