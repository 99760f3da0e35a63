"""Non-finite and ill-typed episode values are ConfigErrors naming the field when the config is
built (they used to pass validation and fail later with misleading errors)."""

from __future__ import annotations

import math

import pytest

from hexagent_gym.config import ConfigError
from hexagent_gym.episode import EpisodeConfig


@pytest.mark.parametrize("field, value, message", [
    ("arrival_rate", math.inf, "arrival_rate must be a finite number > 0"),
    ("arrival_rate", math.nan, "arrival_rate must be a finite number > 0"),
    ("load", math.inf, "load must be a finite number > 0"),
    ("load", -1.0, "load must be a finite number > 0"),
    ("planning_latency", math.inf, "planning_latency must be finite seconds >= 0"),
    ("planning_latency", math.nan, "planning_latency must be finite seconds >= 0"),
    ("num_workflows", True, "num_workflows must be an integer >= 1"),
    ("estimation_error", math.nan, "estimation_error must be in"),
])
def test_bad_values_name_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message):
        EpisodeConfig(**{field: value})


def test_an_unbounded_prefix_cache_stays_allowed():
    assert EpisodeConfig(prefix_cache_tokens=math.inf).prefix_cache_tokens == math.inf
