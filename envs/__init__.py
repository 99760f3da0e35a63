"""Gymnasium environments over the hexagent_gym simulator core.

Installed as ``hexagent_gym.envs`` (the checkout's ``envs/`` folder). Importing it registers
``hexagent_gym/PDCluster-v0`` with gymnasium; so does ``import hexagent_gym`` (``gym_hook``). The
env module itself loads on first attribute access, e.g. ``hexagent_gym.envs.PDClusterEnv``.
"""

from __future__ import annotations

from typing import Any

from hexagent_gym import ENV_ID
from hexagent_gym.envs.registration import register_envs

_LAZY = {
    "PDClusterEnv": "hexagent_gym.envs.pd_cluster_env",
    "make_env_fn": "hexagent_gym.envs.pd_cluster_env",
    "RolloutResult": "hexagent_gym.envs.rollout",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hexagent_gym.envs' has no attribute '{name}'")
    import importlib

    return getattr(importlib.import_module(module), name)


register_envs()

__all__ = ["ENV_ID", "register_envs", *_LAZY]
