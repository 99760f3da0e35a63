"""Registration of the env: with gymnasium (``gymnasium.make("hexagent_gym/PDCluster-v0")``
after ``import hexagent_gym``, through the plug-in below and ``hexagent_gym.gym_hook``) and with
the core, as the factory behind ``hexagent_gym.make`` (the
``hexagent_gym.plugins`` entry point declared in ``pyproject.toml``).
"""

from __future__ import annotations

from hexagent_gym import ENV_ID
from hexagent_gym.policy import register_env

ENTRY_POINT = "hexagent_gym.envs.pd_cluster_env:PDClusterEnv"


def register_envs() -> None:
    """Register every env id of this package with gymnasium (idempotent).

    ``gymnasium.make`` wraps the env in ``hexagent_gym.envs.masks.ActionMasks`` outermost (after
    its checker, order and time-limit wrappers), so ``make(...).action_masks()`` works.
    """
    import gymnasium

    from hexagent_gym.envs.masks import action_masks_wrapper_spec

    if ENV_ID not in gymnasium.registry:
        gymnasium.register(id=ENV_ID, entry_point=ENTRY_POINT,
                           additional_wrappers=(action_masks_wrapper_spec(),))


def register() -> None:
    """The plug-in: the env factory for ``hexagent_gym.make``, and the gymnasium id."""
    register_env(ENV_ID, ENTRY_POINT)
    register_envs()
