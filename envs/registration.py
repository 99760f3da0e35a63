"""Gymnasium registration of the env ids (``gymnasium.make("hexagent_gym/PDCluster-v0")``).

``import hexagent_gym`` calls :func:`register_envs` as soon as gymnasium is (or gets) imported,
without importing gymnasium itself: see ``hexagent_gym/__init__.py``. Gymnasium ≥ 1.0 no longer
loads ``gymnasium.envs`` entry-point plugins, so there is no plugin entry.
"""

from __future__ import annotations

from envs import ENV_ID

ENTRY_POINT = "envs.pd_cluster_env:PDClusterEnv"


def register_envs() -> None:
    """Register every env id of this package with gymnasium (idempotent)."""
    import gymnasium

    if ENV_ID in gymnasium.registry:
        return
    gymnasium.register(id=ENV_ID, entry_point=ENTRY_POINT)
