"""HexAgent-Gym: simulate and schedule agentic LLM workflows on heterogeneous P-D clusters.

The simulator core in this package imports no gymnasium, torch or stable-baselines3.
"""

from hexagent_gym.arrivals import EpisodeWorkload, sample_episode
from hexagent_gym.cluster import ClusterSpec, load_cluster
from hexagent_gym.config import ConfigError
from hexagent_gym.decisions import DecisionPoint, Stage
from hexagent_gym.horizon import HorizonCache
from hexagent_gym.latency import LatencyModel
from hexagent_gym.metrics import EpisodeResult, attainment, req
from hexagent_gym.simulator import Simulator
from hexagent_gym.workload import Trace, TraceError, load_trace

__version__ = "0.1.0"

__all__ = [
    "ClusterSpec", "ConfigError", "DecisionPoint", "EpisodeResult", "EpisodeWorkload",
    "HorizonCache", "LatencyModel", "Simulator", "Stage", "Trace", "TraceError", "attainment",
    "load_cluster", "load_trace", "req", "sample_episode",
]
