"""Pluggable rewards of :class:`~hexagent_gym.envs.pd_cluster_env.PDClusterEnv`, looked up by name.

A reward sees only outcomes: the ratio ``r = C_w / H_w`` of every workflow that completes during a
step (completion minus arrival, over the true standalone horizon), and at the end of a drained
episode the ratios of all workflows. Picks inside one decision point take no simulated time, so
those steps earn 0 unless the pick closed the decision point and the simulator advanced.

Built-in rewards (α is the env's ``target_alpha``):

``tail`` (default)
    ``−max(0, r − α)`` per completed workflow, plus at the end of a drained episode
    ``−terminal_weight · (Req99 − 1)`` (``terminal_weight`` = 1 by default). Workflows within the
    target cost nothing; the penalty grows linearly with how far a workflow overshoots α, and the
    terminal term pulls on the 99th percentile directly, so the return tracks tail attainment.
``attainment``
    ``+1/N`` per completed workflow with ``r ≤ α`` (N = workflows in the episode): the return of a
    drained episode equals the attainment at α, in [0, 1].
``mean_ratio``
    ``−(r − 1)`` per completed workflow: the return is minus the summed slowdown over standalone.

Add one with :func:`register_reward`; any object with ``reset(num_workflows)``,
``completions(ratios) -> float`` and ``terminal(ratios) -> float`` works.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np

from hexagent_gym.config import ConfigError
from hexagent_gym.registry import Registry
from hexagent_gym.sim.metrics import req


@runtime_checkable
class Reward(Protocol):
    """What the env needs from a reward."""

    name: str

    def reset(self, num_workflows: int) -> None:
        """Start of an episode of ``num_workflows`` workflows."""

    def completions(self, ratios: list[float]) -> float:
        """Reward for the workflows that completed during one step (``ratios`` may be empty)."""

    def terminal(self, ratios: np.ndarray) -> float:
        """Extra reward when the episode drains (``ratios``: every workflow of the episode)."""


class TailReward:
    """``−max(0, r − α)`` per completion and ``−terminal_weight · (Req99 − 1)`` at the end."""

    name = "tail"

    def __init__(self, alpha: float, terminal_weight: float = 1.0) -> None:
        self.alpha = float(alpha)
        self.terminal_weight = float(terminal_weight)

    def reset(self, num_workflows: int) -> None:
        pass

    def completions(self, ratios: list[float]) -> float:
        alpha = self.alpha
        return -sum(r - alpha for r in ratios if r > alpha)

    def terminal(self, ratios: np.ndarray) -> float:
        if self.terminal_weight == 0.0 or len(ratios) == 0:
            return 0.0
        return -self.terminal_weight * (req(ratios, 0.99) - 1.0)


class AttainmentReward:
    """``+1/N`` per workflow completing within ``α·H_w``; the return is attainment at α."""

    name = "attainment"

    def __init__(self, alpha: float) -> None:
        self.alpha = float(alpha)
        self._unit = 1.0

    def reset(self, num_workflows: int) -> None:
        self._unit = 1.0 / max(num_workflows, 1)

    def completions(self, ratios: list[float]) -> float:
        alpha = self.alpha
        return self._unit * sum(1 for r in ratios if r <= alpha)

    def terminal(self, ratios: np.ndarray) -> float:
        return 0.0


class MeanRatioReward:
    """``−(r − 1)`` per completion: minus each workflow's slowdown over running alone."""

    name = "mean_ratio"

    def __init__(self, alpha: float | None = None) -> None:
        self.alpha = alpha  # unused; accepted so every reward takes the env's target

    def reset(self, num_workflows: int) -> None:
        pass

    def completions(self, ratios: list[float]) -> float:
        return -sum(r - 1.0 for r in ratios)

    def terminal(self, ratios: np.ndarray) -> float:
        return 0.0


RewardFactory = Callable[..., Reward]
_REWARDS = Registry("reward", error=ConfigError)


def register_reward(name: str, factory: RewardFactory) -> None:
    """Register ``factory(alpha=..., **reward_kwargs) -> Reward`` under ``name``.

    Raises:
        ValueError: the name is taken.
    """
    _REWARDS.register(name, factory)


def reward_names() -> list[str]:
    """Registered reward names, sorted."""
    return _REWARDS.names()


def make_reward(name: str, alpha: float, **kwargs: Any) -> Reward:
    """Build the reward registered as ``name`` for target SLO scale ``alpha``.

    Raises:
        ConfigError: unknown name (the message lists the known ones and the closest match), or
            keyword arguments the reward does not take.
    """
    factory = _REWARDS.factory(name)
    try:
        reward = factory(alpha=alpha, **kwargs)
    except TypeError as exc:
        raise ConfigError(f"reward '{str(name).lower()}' does not accept reward_kwargs "
                          f"{kwargs}: {exc}") from None
    return reward


register_reward("tail", TailReward)
register_reward("attainment", AttainmentReward)
register_reward("mean_ratio", MeanRatioReward)
