"""Gymnasium environments over the hexagent_gym simulator core.

Importing this package is light: the env module (and gymnasium) load on first attribute access,
e.g. ``envs.PDClusterEnv`` or ``envs.make_env_fn``.
"""

from __future__ import annotations

from typing import Any

ENV_ID = "hexagent_gym/PDCluster-v0"

_LAZY = {
    "PDClusterEnv": "envs.pd_cluster_env",
    "make_env_fn": "envs.pd_cluster_env",
    "RolloutResult": "envs.rollout",
    "register_envs": "envs.registration",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'envs' has no attribute '{name}'")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = ["ENV_ID", *_LAZY]
