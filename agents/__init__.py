"""Scheduling policies: HexAgent reference, classical baselines and learned schedulers."""
