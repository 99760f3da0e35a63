"""HexAgent-Gym: simulate and schedule agentic LLM workflows on heterogeneous P-D clusters.

The simulator core in this package imports no gymnasium, torch or stable-baselines3, and never
names the layers above it. The env lives in the ``envs`` package, which registers the gymnasium id
``hexagent_gym/PDCluster-v0`` when imported and plugs the factory behind :func:`make` into the core
(``hexagent_gym.policy``: entry points); the built-in policies plug in from ``agents``.
"""

from typing import Any

from hexagent_gym.arrivals import EpisodeWorkload, sample_episode
from hexagent_gym.cluster import ClusterSpec, load_cluster
from hexagent_gym.config import ConfigError
from hexagent_gym.decisions import DecisionPoint, Stage
from hexagent_gym.horizon import HorizonCache
from hexagent_gym.latency import LatencyModel
from hexagent_gym.metrics import EpisodeResult, attainment, req
from hexagent_gym.policy import make_env
from hexagent_gym.simulator import Simulator
from hexagent_gym.workload import Trace, TraceError, load_trace

__version__ = "0.1.0"
ENV_ID = "hexagent_gym/PDCluster-v0"


def make(config: Any = None, **overrides: Any) -> Any:
    """Build a ``PDClusterEnv`` (the env behind ``hexagent_gym/PDCluster-v0``).

    Args:
        config: experiment YAML path, shipped experiment name, mapping, or None (defaults).
        **overrides: config keys that take precedence, e.g. ``cluster="tiny-2p2d"``,
            ``num_workflows=8``, ``reward="attainment"``; see ``envs.pd_cluster_env``.
    """
    return make_env(ENV_ID, config, **overrides)

__all__ = [
    "ClusterSpec", "ConfigError", "DecisionPoint", "EpisodeResult", "EpisodeWorkload",
    "HorizonCache", "LatencyModel", "Simulator", "Stage", "Trace", "TraceError", "attainment",
    "load_cluster", "load_trace", "make", "req", "sample_episode",
]
