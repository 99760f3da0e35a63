"""The SB3 side of the equivariant scheduler: a MaskablePPO policy class around
:class:`~hexagent_gym.agents.equivariant_net.EquivariantNet`, and the architecture names
``scripts/train.py`` builds models from.

:class:`EquivariantPolicy` replaces SB3's flatten-and-MLP with the shared-weight network (its
features extractor just passes the Dict observation through), accepts observations of any K,
P and D (:meth:`EquivariantPolicy.obs_to_tensor`), and leaves invalid triples to MaskablePPO's
masking. The plain ``MultiInputPolicy`` of sb3-contrib is the baseline (:data:`POLICY_CLASSES`).

Saved models record the policy class by reference: models saved before this module existed
name ``agents.learned.EquivariantPolicy``, later ones
``agents.equivariant_policy.EquivariantPolicy`` (``saved_models.load_saved_model`` reads both under
``hexagent_gym.agents``), current ones ``hexagent_gym.agents.equivariant_policy.EquivariantPolicy``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from sb3_contrib.common.maskable.distributions import (
    MaskableCategoricalDistribution,
    MaskableDistribution,
)
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from stable_baselines3.common.type_aliases import Schedule

from hexagent_gym.agents.equivariant_net import STATIC_INSTANCE_FEATURES, EquivariantNet
from hexagent_gym.envs.encoding import DECODE_FEATURES, PREFILL_FEATURES


def _masked_log_probs(logits: th.Tensor, action_masks: Any) -> tuple[th.Tensor, th.Tensor]:
    """(masked log-probabilities (B, A), boolean masks (B, A)) of a batch of logits, computed
    as sb3-contrib's ``MaskableCategorical`` does (normalise, set invalid actions to −1e8,
    normalise again), without building its distribution objects twice and validating them on
    every call: the same numbers bit for bit, and the same gradients. ``forward`` and
    ``evaluate_actions`` (every rollout step and every PPO minibatch) use it; ``get_distribution``
    still returns sb3-contrib's distribution."""
    logits = logits.view(-1, logits.shape[-1])
    logits = logits - logits.logsumexp(dim=-1, keepdim=True)
    masks = th.as_tensor(action_masks, dtype=th.bool, device=logits.device).reshape(logits.shape)
    logits = th.where(masks, logits, th.tensor(-1e8, dtype=logits.dtype, device=logits.device))
    return logits - logits.logsumexp(dim=-1, keepdim=True), masks


class DictPassThrough(BaseFeaturesExtractor):
    """Hands the Dict observation to the policy unchanged (the policy does its own encoding)."""

    def __init__(self, observation_space: spaces.Dict) -> None:
        super().__init__(observation_space, features_dim=1)

    def forward(self, observations: dict[str, th.Tensor]) -> dict[str, th.Tensor]:
        return observations


class EquivariantPolicy(MaskableActorCriticPolicy):
    """MaskablePPO policy whose logits come from :class:`EquivariantNet`.

    Use ``MaskablePPO(EquivariantPolicy, env, policy_kwargs=dict(hidden=64))``; it saves and
    loads like any SB3 policy (``MaskablePPO.load(path)``; the class is importable from here
    and from ``hexagent_gym.agents.learned``; models saved under the package's older names load
    through ``saved_models.load_saved_model``). ``net_arch`` and ``activation_fn`` are accepted for
    SB3 compatibility and ignored.

    Args:
        observation_space: the env's Dict space (``calls``, ``delta``, ``prefill``, ``decode``,
            ``globals``). Its K, P_max and D_max only fix the training shapes.
        action_space: ``Discrete(K·P_max·D_max)``.
        lr_schedule: learning-rate schedule.
        hidden, score_hidden, value_hidden: widths (see :class:`EquivariantNet`).
        prior: initial weight of the HexAgent indicators (:meth:`EquivariantNet.init_prior`;
            0 starts from a near-uniform policy).
        exclude_features: prefill/decode feature names the network does not read (default
            :data:`STATIC_INSTANCE_FEATURES`; ``()`` reads them all).
        cache_feature: the network also reads each call's cache affinity per prefill instance
            (``obs["cached"]``; :class:`EquivariantNet`). Off by default.
        workflow_feature: the network also reads each call's workflow as a front end knows it
            (``obs["workflow"]``, env option ``workflow_obs``) and starts from
            ``hexagent-horizon``'s rule (:class:`EquivariantNet`). Off by default.
        ortho_init: orthogonal init (gain √2 hidden, 0.01 logits, 1 value), as SB3 does.
    """

    def __init__(self, observation_space: spaces.Dict, action_space: spaces.Discrete,
                 lr_schedule: Schedule, hidden: int = 64, score_hidden: int = 32,
                 value_hidden: int = 64, prior: float = 4.0,
                 exclude_features: tuple[str, ...] | list[str] = STATIC_INSTANCE_FEATURES,
                 ortho_init: bool = True, cache_feature: bool = False,
                 workflow_feature: bool = False, **kwargs: Any) -> None:
        for key in ("calls", "delta", "prefill", "decode", "globals"):
            if key not in observation_space.spaces:
                raise ValueError(f"EquivariantPolicy needs the PDClusterEnv Dict observation; "
                                 f"key '{key}' is missing from {list(observation_space.spaces)}")
        known = set(PREFILL_FEATURES) | set(DECODE_FEATURES)
        unknown = sorted(set(exclude_features) - known)
        if unknown:
            raise ValueError(f"exclude_features: unknown feature(s) {unknown}; known: "
                             f"{', '.join(sorted(known))}")
        if "present" in exclude_features:
            raise ValueError("exclude_features cannot drop 'present' (it marks padding)")
        if cache_feature and "cached" not in observation_space.spaces:
            raise ValueError("cache_feature=True reads the observation's 'cached' key, which "
                             f"this space lacks: {list(observation_space.spaces)}")
        if workflow_feature and "workflow" not in observation_space.spaces:
            raise ValueError("workflow_feature=True reads the observation's 'workflow' key "
                             "(env option workflow_obs=True), which this space lacks: "
                             f"{list(observation_space.spaces)}")
        self.arch = {"hidden": int(hidden), "score_hidden": int(score_hidden),
                     "value_hidden": int(value_hidden), "prior": float(prior),
                     "exclude_features": tuple(exclude_features)}
        if cache_feature:  # saved only when on: files without the key load as before
            self.arch["cache_feature"] = True
        if workflow_feature:
            self.arch["workflow_feature"] = True
        kwargs.setdefault("features_extractor_class", DictPassThrough)
        super().__init__(observation_space, action_space, lr_schedule, ortho_init=ortho_init,
                         **kwargs)

    def _build_mlp_extractor(self) -> None:  # the net replaces SB3's MLP extractor
        pass

    def _build(self, lr_schedule: Schedule) -> None:
        sp = self.observation_space.spaces
        arch = dict(self.arch)
        drop = set(arch.pop("exclude_features"))
        self.net = EquivariantNet(
            sp["calls"].shape[-1], sp["prefill"].shape[-1], sp["decode"].shape[-1],
            sp["globals"].shape[-1], **arch,
            prefill_columns=[i for i, f in enumerate(PREFILL_FEATURES) if f not in drop],
            decode_columns=[i for i, f in enumerate(DECODE_FEATURES) if f not in drop])
        if self.ortho_init:
            self.net.apply(lambda m: self.init_weights(m, gain=math.sqrt(2)))
            for layer in self.net.output_layers:
                self.init_weights(layer, gain=0.01)
            self.init_weights(self.net.value_mlp[-1], gain=1.0)
        self.net.init_prior()
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1),
                                              **self.optimizer_kwargs)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(self.arch)
        return data

    # -- observations of any K / P / D ----------------------------------------------------------
    def obs_to_tensor(self, observation: Any) -> tuple[dict[str, th.Tensor], bool]:
        """Like SB3's, but the shapes need not match the training space: the network is shared
        over slots, so a model trained on one cluster runs on another (``calls`` of rank 3
        means a batch)."""
        if not isinstance(observation, dict):
            return super().obs_to_tensor(observation)
        vectorized = np.ndim(observation["calls"]) == 3
        out = {}
        for key, value in observation.items():
            arr = np.asarray(value, dtype=np.float32)
            out[key] = th.as_tensor(arr if vectorized else arr[None], device=self.device)
        return out, vectorized

    def _net_obs(self, obs: dict[str, th.Tensor]) -> dict[str, th.Tensor]:
        return {k: v.float() for k, v in obs.items()}

    # -- the SB3 entry points -------------------------------------------------------------------
    def _distribution(self, logits: th.Tensor, action_masks: Any) -> MaskableDistribution:
        base = self.action_dist
        if logits.shape[-1] != base.action_dim:  # another cluster size / window than training
            base = MaskableCategoricalDistribution(logits.shape[-1])
        dist = base.proba_distribution(action_logits=logits)
        if action_masks is not None:
            dist.apply_masking(action_masks)
        return dist

    def forward(self, obs: dict[str, th.Tensor], deterministic: bool = False,
                action_masks: np.ndarray | None = None
                ) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """Actions, values and log-probabilities of a batch (what a rollout step calls, under
        ``th.no_grad``). Without gradients it runs in ``th.inference_mode`` (less autograd
        bookkeeping per op; the same numbers) and returns ordinary tensors."""
        if action_masks is None or th.is_grad_enabled():
            return self._forward(obs, deterministic, action_masks)
        with th.inference_mode():
            actions, values, log_prob = self._forward(obs, deterministic, action_masks)
        return actions.clone(), values.clone(), log_prob.clone()

    def _forward(self, obs: dict[str, th.Tensor], deterministic: bool,
                 action_masks: np.ndarray | None) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        logits, values = self.net(self._net_obs(obs))
        if action_masks is None:
            dist = self._distribution(logits, action_masks)
            actions = dist.get_actions(deterministic=deterministic)
            return (actions.reshape((-1, *self.action_space.shape)), values,
                    dist.log_prob(actions))
        log_p, _ = _masked_log_probs(logits, action_masks)
        probs = th.softmax(log_p, dim=-1)
        if deterministic:
            actions = th.argmax(probs, dim=1)
        else:  # Categorical.sample: one draw per row, the same use of torch's RNG
            actions = th.multinomial(probs, 1, True).T.reshape(-1)
        log_prob = log_p.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        return actions.reshape((-1, *self.action_space.shape)), values, log_prob

    def evaluate_actions(self, obs: dict[str, th.Tensor], actions: th.Tensor,
                         action_masks: th.Tensor | None = None
                         ) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
        logits, values = self.net(self._net_obs(obs))
        if action_masks is None:
            dist = self._distribution(logits, action_masks)
            return values, dist.log_prob(actions), dist.entropy()
        log_p, masks = _masked_log_probs(logits, action_masks)
        log_prob = log_p.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        # MaskableCategorical.entropy: masked actions contribute nothing
        p_log_p = th.where(masks, log_p * th.softmax(log_p, dim=-1),
                           th.tensor(0.0, device=log_p.device))
        return values, log_prob, -p_log_p.sum(-1)

    def get_distribution(self, obs: dict[str, th.Tensor],
                         action_masks: np.ndarray | None = None) -> MaskableDistribution:
        net = self.net
        return self._distribution(net.logits(net.embed(self._net_obs(obs))), action_masks)

    def predict_values(self, obs: dict[str, th.Tensor]) -> th.Tensor:
        net = self.net
        return net.value(net.embed(self._net_obs(obs)))

    def action_logits(self, obs: dict[str, th.Tensor]) -> th.Tensor:
        """Unmasked logits (B, K·P·D) of a batch of tensor observations."""
        net = self.net
        return net.logits(net.embed(self._net_obs(obs)))

    def greedy_action(self, observation: dict[str, np.ndarray], action_mask: np.ndarray) -> int:
        """``predict(observation, action_masks=action_mask, deterministic=True)`` for one
        observation on the CPU, without SB3's distribution objects (faster per pick; measured
        in docs/performance.md). It repeats sb3-contrib's arithmetic step for step, so
        near-ties break the same way: normalise the logits, set invalid ones to −1e8,
        normalise again, softmax, first argmax (tested against ``predict``)."""
        with th.inference_mode():
            obs = {k: th.as_tensor(np.asarray(v, dtype=np.float32))[None]
                   for k, v in observation.items()}
            logits = self.action_logits(obs)
            logits = logits - logits.logsumexp(dim=-1, keepdim=True)
            masks = th.as_tensor(action_mask, dtype=th.bool).reshape(logits.shape)
            logits = th.where(masks, logits, th.tensor(-1e8, dtype=logits.dtype))
            logits = logits - logits.logsumexp(dim=-1, keepdim=True)
            return int(th.argmax(th.softmax(logits, dim=-1), dim=1)[0])


POLICY_CLASSES: dict[str, Any] = {"equivariant": EquivariantPolicy,
                                  "mlp": "MultiInputPolicy"}
"""``--policy`` choices of ``scripts/train.py``: the equivariant policy or sb3-contrib's plain
flattening ``MultiInputPolicy`` (fixed shapes, no weight sharing) as a baseline."""


def make_model(env: Any, policy: str = "equivariant", **kwargs: Any) -> Any:
    """A fresh MaskablePPO on ``env`` with the named policy architecture.

    Raises:
        ValueError: unknown ``policy``.
    """
    from sb3_contrib import MaskablePPO

    if policy not in POLICY_CLASSES:
        raise ValueError(f"unknown policy architecture '{policy}'; choose one of "
                         f"{', '.join(POLICY_CLASSES)}")
    return MaskablePPO(POLICY_CLASSES[policy], env, **kwargs)


__all__ = ["DictPassThrough", "EquivariantPolicy", "POLICY_CLASSES", "make_model"]
