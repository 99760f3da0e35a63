"""HexAgent-Gym: simulate and schedule agentic LLM workflows on heterogeneous P-D clusters.

``import hexagent_gym`` registers the gymnasium id ``hexagent_gym/PDCluster-v0`` (at once if
gymnasium is already imported, else right after its import: ``hexagent_gym.gym_hook``), so
``gym.make("hexagent_gym/PDCluster-v0")`` works after it.

The simulator core in this package imports no gymnasium, torch or stable-baselines3, and never
names the layers above it. The env lives in the sub-package ``hexagent_gym.envs`` (the checkout's
``envs/`` folder), which plugs the factory behind :func:`make` and the gymnasium id into the core
through entry points (``hexagent_gym.policy``); the built-in policies plug in from
``hexagent_gym.agents``.
"""

import warnings
from typing import Any

from hexagent_gym.cluster.cluster import ClusterSpec, load_cluster
from hexagent_gym.cluster.latency import LatencyModel
from hexagent_gym.config import ConfigError
from hexagent_gym.gym_hook import when_gymnasium_imported
from hexagent_gym.planning.decisions import DecisionPoint, Stage
from hexagent_gym.policy import load_plugins, make_env
from hexagent_gym.sim.horizon import HorizonCache
from hexagent_gym.sim.metrics import EpisodeResult, attainment, req
from hexagent_gym.sim.simulator import Simulator
from hexagent_gym.workload.arrivals import EpisodeWorkload, sample_episode
from hexagent_gym.workload.workload import Trace, TraceError, load_trace

__version__ = "0.1.0"
ENV_ID = "hexagent_gym/PDCluster-v0"


def make(config: Any = None, **overrides: Any) -> Any:
    """Build a ``PDClusterEnv`` (the env behind ``hexagent_gym/PDCluster-v0``).

    Args:
        config: experiment YAML path, shipped experiment name, mapping, or None (defaults).
        **overrides: config keys that take precedence, e.g. ``cluster="tiny-2p2d"``,
            ``num_workflows=8``, ``reward="attainment"``; see ``hexagent_gym.envs.pd_cluster_env``.
    """
    return make_env(ENV_ID, config, **overrides)


def _register_gym_ids() -> None:
    """Run the plug-ins (the env's registers its gymnasium ids). Called during ``import
    gymnasium`` at the latest, so a broken install warns instead of breaking that import."""
    try:
        load_plugins()
    except RuntimeError as exc:
        warnings.warn(f"hexagent_gym could not register {ENV_ID} with gymnasium: {exc}",
                      RuntimeWarning, stacklevel=2)


__all__ = [
    "ClusterSpec", "ConfigError", "DecisionPoint", "EpisodeResult", "EpisodeWorkload",
    "HorizonCache", "LatencyModel", "Simulator", "Stage", "Trace", "TraceError", "attainment",
    "load_cluster", "load_trace", "make", "req", "sample_episode",
]

when_gymnasium_imported(_register_gym_ids)
