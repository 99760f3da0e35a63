"""Gymnasium environments over the hexagent_gym simulator core.

Importing this package registers ``hexagent_gym/PDCluster-v0`` with gymnasium (Gymnasium's own
mechanism: import the package that registers the id, or use ``"envs:hexagent_gym/PDCluster-v0"``);
the env module itself loads on first attribute access, e.g. ``envs.PDClusterEnv``.
"""

from __future__ import annotations

from typing import Any

from envs.registration import register_envs
from hexagent_gym import ENV_ID

_LAZY = {
    "PDClusterEnv": "envs.pd_cluster_env",
    "make_env_fn": "envs.pd_cluster_env",
    "RolloutResult": "envs.rollout",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'envs' has no attribute '{name}'")
    import importlib

    return getattr(importlib.import_module(module), name)


register_envs()

__all__ = ["ENV_ID", "register_envs", *_LAZY]
