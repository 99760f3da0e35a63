"""Hypothesis profiles: CI runs a fixed set of examples (same commit, same verdict); run
``pytest --hypothesis-profile=explore`` to search fresh random examples (how the recompute
reservation bug in ``PlanState._release_list`` was found)."""

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", max_examples=400)
settings.load_profile("ci")
