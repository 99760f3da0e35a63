"""A tiny evaluation grid shared by the evaluation and distributed-backend tests."""

from __future__ import annotations

from hexagent_gym.episode import EpisodeConfig
from hexagent_gym.experiments import Experiment, Grid

TINY = EpisodeConfig(cluster="tiny-2p2d", trace="bfcl_v3", num_workflows=6, load=1.0)


def tiny_experiment(policies=("hexagent", "fcfs"), seeds=(0, 1), **grid) -> Experiment:
    """hexagent and fcfs on 6 BFCL workflows of the 2+2 toy cluster, two seeds."""
    return Experiment("tiny", Grid(base=TINY, policies=tuple(policies), seeds=tuple(seeds),
                                   **grid))
