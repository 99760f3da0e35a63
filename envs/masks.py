"""Action masks through Gymnasium 1.x wrapper stacks.

Gymnasium 1.x wrappers no longer forward unknown attributes to the env they wrap, so
``gymnasium.make("hexagent_gym/PDCluster-v0").action_masks()`` would hit ``OrderEnforcing`` (or
``TimeLimit``, ``RecordEpisodeStatistics``, ...) and raise ``AttributeError``. The id is therefore
registered with :class:`ActionMasks` as an ``additional_wrappers`` entry, which ``gymnasium.make``
applies outermost, so the object ``make`` returns has the method. Under any other stack,
``env.get_wrapper_attr("action_masks")()`` reaches the env's method (what SB3's and gymnasium's
vector envs do), and ``info["action_mask"]`` carries the same mask on every reset and step.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import WrapperSpec


class ActionMasks(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Exposes ``action_masks()`` of the wrapped stack on the wrapper itself.

    Behaviour (observations, rewards, infos, spaces) is unchanged; the wrapper only adds the
    method. ``RecordConstructorArgs`` makes it recreatable from ``env.spec`` (``gymnasium.make``
    refuses additional wrappers without recorded constructor arguments).
    """

    def __init__(self, env: gym.Env) -> None:
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)

    def action_masks(self) -> np.ndarray:
        """The current joint validity mask (bool, ``K·P_max·D_max``), a fresh copy each call,
        from the innermost env or wrapper that defines ``action_masks``."""
        return self.env.get_wrapper_attr("action_masks")()


def action_masks_wrapper_spec() -> WrapperSpec:
    """The ``additional_wrappers`` entry of the registered id (equal to what ``env.spec``
    reports for an :class:`ActionMasks`, so ``gymnasium.make(env.spec)`` recreates the env)."""
    kwargs: dict[str, Any] = {}
    return WrapperSpec(name=ActionMasks.__name__,
                       entry_point=f"{ActionMasks.__module__}:{ActionMasks.__name__}",
                       kwargs=kwargs)


__all__ = ["ActionMasks", "action_masks_wrapper_spec"]
