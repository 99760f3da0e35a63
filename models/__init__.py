"""Trained schedulers shipped with hexagent-gym (see README.md here and docs/learned.md).

This is a package only so that the model files install next to the code; it holds no logic.
"""
