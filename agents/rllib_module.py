"""A PPO RLModule for RLlib's new API stack that gives invalid actions no probability.

RLlib 2.x ships action masking only as an example (``ray.rllib.examples.rl_modules.classes
.action_masking_rlm``), and that example imports the deprecated ``PPOTorchRLModule`` alias, so
importing it logs a ``DeprecationWarning``. :class:`MaskedPPOTorchRLModule` is the same idea on
RLlib's public ``DefaultPPOTorchRLModule``: the env's observation is a ``Dict`` with
``"action_mask"`` (float 0/1, length ``n``) and ``"observations"`` (a flat ``Box``; what
``hexagent_gym.agents.rllib_env.RLlibObservation`` produces). The default PPO encoder, policy and
value heads are built for ``"observations"`` alone, and every forward pass sets the logits of
actions whose mask is 0 to RLlib's ``FLOAT_MIN``, so their probability is exactly 0 while a row
with no valid action (the drained episode's last observation, only ever valued, never acted on)
stays a finite uniform distribution.

This module imports ray and torch; ``hexagent_gym.agents.rllib_env`` imports it only inside
``ppo_config``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
from ray.rllib.core.columns import Columns
from ray.rllib.utils.torch_utils import FLOAT_MIN

# the keys of hexagent_gym.agents.rllib_env.RLlibObservation (not imported from there: that
# module imports this one inside ppo_config, and the project's imports form no circle)
MASK_KEY, OBS_KEY = "action_mask", "observations"


class MaskedPPOTorchRLModule(DefaultPPOTorchRLModule):
    """``DefaultPPOTorchRLModule`` over ``obs["observations"]`` with ``obs["action_mask"]``
    applied to the action logits.

    Args (keywords, as RLlib passes them): ``observation_space`` must be a ``Dict`` with exactly
    the keys ``"action_mask"`` and ``"observations"`` (else ``ValueError``); the rest goes to
    ``DefaultPPOTorchRLModule`` unchanged (``model_config`` etc.).

    Contract: ``_forward`` (inference and exploration) and ``_forward_train`` return the default
    module's outputs with ``ACTION_DIST_INPUTS`` set to ``FLOAT_MIN`` wherever the mask is 0
    (the valid logits are untouched); ``compute_values`` ignores the mask. The input batch is
    never modified in place (RLlib reuses it between the value and the train passes).
    """

    def __init__(self, *, observation_space: gym.Space | None = None, **kwargs: Any) -> None:
        if not (isinstance(observation_space, gym.spaces.Dict)
                and set(observation_space.spaces) == {MASK_KEY, OBS_KEY}):
            raise ValueError("MaskedPPOTorchRLModule needs a Dict observation space with the keys "
                             f"{MASK_KEY!r} and {OBS_KEY!r} (hexagent_gym.agents.rllib_env"
                             f".make_rllib_env builds it), got {observation_space!r}")
        # the default catalog builds the encoder from this space, so it sees the features only;
        # setup() restores the full space, which RLlib's connectors and checks expect
        self._space_with_mask = observation_space
        super().__init__(observation_space=observation_space[OBS_KEY], **kwargs)

    def setup(self) -> None:
        super().setup()
        self.observation_space = self._space_with_mask

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        mask, inner = _split(batch)
        return _mask_logits(super()._forward(inner, **kwargs), mask)

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        mask, inner = _split(batch)
        return _mask_logits(super()._forward_train(inner, **kwargs), mask)

    def compute_values(self, batch: dict[str, Any], embeddings: Any | None = None) -> Any:
        if embeddings is None:
            _, batch = _split(batch)
        return super().compute_values(batch, embeddings)


def _split(batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
    """(the mask, a shallow copy of ``batch`` whose OBS is the ``observations`` tensor)."""
    obs = batch[Columns.OBS]
    if not isinstance(obs, dict) or MASK_KEY not in obs:
        # never run unmasked: a batch without the mask would give invalid actions probability
        raise ValueError(f"MaskedPPOTorchRLModule: the batch's {Columns.OBS!r} must be a dict with "
                         f"{MASK_KEY!r} and {OBS_KEY!r}, got {type(obs).__name__}")
    return obs[MASK_KEY], {**batch, Columns.OBS: obs[OBS_KEY]}


def _mask_logits(out: dict[str, Any], mask: torch.Tensor) -> dict[str, Any]:
    logits = out[Columns.ACTION_DIST_INPUTS]
    out[Columns.ACTION_DIST_INPUTS] = logits.masked_fill(mask <= 0, FLOAT_MIN)
    return out


__all__ = ["MaskedPPOTorchRLModule"]
