"""The learned scheduler: :class:`LearnedPolicy` runs a trained MaskablePPO model as a scheduler,
by default the shipped model (:data:`DEFAULT_MODEL`).

:class:`LearnedPolicy` wraps a trained model (or loads a ``.zip``) with both ``pick(dp)`` (bare
simulator, what ``env.rollout`` uses for policy objects and what the evaluation grid runs) and
``predict(obs, action_masks=...)``. The built-in policy name ``learned`` (registered by
``hexagent_gym.agents.registration``) resolves to ``LearnedPolicy()``.

The model's parts live in their own modules and are re-exported here, so
``hexagent_gym.agents.learned`` stays the one import path of the learned-scheduler API:

- ``agents/equivariant_net.py``: :class:`EquivariantNet` (the permutation-equivariant torch
  network and its feature maps), :data:`STATIC_INSTANCE_FEATURES` and the feature-count
  constants;
- ``agents/equivariant_policy.py``: :class:`EquivariantPolicy` (the MaskablePPO policy class),
  :class:`DictPassThrough`, :data:`POLICY_CLASSES` and :func:`make_model`.

Models saved before the split record their policy class as ``agents.learned.EquivariantPolicy``
(the package's name before it installed under ``hexagent_gym``); the re-export and
``saved_models.load_saved_model``'s renaming keep them loading.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch as th

from hexagent_gym.agents import equivariant_net as _net
from hexagent_gym.agents.equivariant_net import (
    N_DELTA,
    N_HORIZON,
    N_REL,
    PHI_IS_BEST,
    PHI_IS_TOP,
    STATIC_INSTANCE_FEATURES,
    WORKFLOW_COLUMNS,
    EquivariantNet,
)
from hexagent_gym.agents.equivariant_policy import (
    POLICY_CLASSES,
    DictPassThrough,
    EquivariantPolicy,
    make_model,
)
from hexagent_gym.agents.saved_models import load_saved_model
from hexagent_gym.envs.encoding import Encoder, workflow_rows

if TYPE_CHECKING:
    from hexagent_gym.planning.decisions import DecisionPoint
    from hexagent_gym.sim.simulator import Simulator

# the network's private helpers were defined here before the split; kept importable
_C, _BIG = _net._C, _net._BIG
_PRESENT, _PICKED, _AGE, _WAIT, _H_EST = (_net._PRESENT, _net._PICKED, _net._AGE, _net._WAIT,
                                          _net._H_EST)
_MIN_DELTA, _RISK = _net._MIN_DELTA, _net._RISK
_expand, _mlp, _masked_pool, _masked_extreme = (_net._expand, _net._mlp, _net._masked_pool,
                                                _net._masked_extreme)

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"
"""The shipped models' directory (package data; ``models/README.md``)."""
DEFAULT_MODEL = MODELS_DIR / "learned_hetero1_bfcl.zip"
"""The shipped model (``models/README.md``): equivariant policy, cloned from HexAgent with a
one-step lookahead (+ DAgger) and fine-tuned by PPO on hetero-1 / bfcl_v3."""


class LearnedPolicy:
    """A trained MaskablePPO model as a scheduler for ``env.rollout`` and the policy registry.

    ``pick(dp)`` encodes the decision point exactly as the env does (an
    :class:`~hexagent_gym.envs.encoding.Encoder` over the episode's simulator) and takes the model's
    deterministic choice among the valid actions, so ``env.rollout(LearnedPolicy(...))`` runs
    on the bare simulator and gives the same picks as ``env.rollout(model)`` through the env.
    ``predict`` forwards to the model (with masks), for code that steps an env. A model trained
    with the env's ``workflow`` key (``workflow_obs=True``) gets it here too, built from the
    decision's calls as the env builds it (``hexagent_gym.envs.encoding.workflow_rows``).

    An equivariant model runs on any cluster and window (the encoder is sized to the episode);
    a ``MultiInputPolicy`` model needs the training shapes (smaller clusters are padded).

    Args:
        model: a MaskablePPO model, or a path to a saved one (``.zip``); None loads the shipped
            :data:`DEFAULT_MODEL`.
        k: call slots of the encoder (None: the model's training K, grown when a decision shows
            more calls). On a simulator without a window (``max_calls_per_decision`` None, the
            evaluation grid's default) every waiting call of the stage is in the decision, so
            an equivariant model scores all of them, not only the first K it was trained with;
            the env (and ``env.rollout``) shows its K oldest.
        time_scale: seconds per time unit of the features; must match training (env default 10).
        deterministic: argmax (True) or sample from the masked distribution (torch's RNG).
        threads: ``torch.set_num_threads`` applied on construction (default 1: a forward pass
            on one observation is fastest single-threaded, and torch's default of one thread
            per core stalls badly when the cores are shared; None leaves torch's setting).
    """

    name = "learned"

    def __init__(self, model: Any = None, k: int | None = None, time_scale: float = 10.0,
                 deterministic: bool = True, threads: int | None = 1) -> None:
        if threads is not None:
            th.set_num_threads(threads)
        if model is None or isinstance(model, str | Path):
            model = load_saved_model(DEFAULT_MODEL if model is None else model)
        self.model = model
        self.policy = model.policy
        space = self.policy.observation_space
        self.equivariant = isinstance(self.policy, EquivariantPolicy)
        self.train_k, self.train_p, self.train_d = (space["calls"].shape[0],
                                                    *space["delta"].shape[1:])
        # observation keys the model was trained on: newer env keys (e.g. "cached") are dropped
        # before the model sees them, so models saved before a key was added keep working
        self.keys = tuple(space.spaces)
        self._workflow_obs = "workflow" in self.keys
        self._workflow = None  # the open decision's workflow rows (fixed within a decision)
        self.k = k
        self.time_scale = float(time_scale)
        self.deterministic = deterministic
        # the greedy fast path needs the equivariant network on the CPU
        self._fast = (deterministic and self.equivariant
                      and next(self.policy.parameters()).device.type == "cpu")
        self._sim: Simulator | None = None
        self._encoder: Encoder | None = None
        self._dp: DecisionPoint | None = None

    @classmethod
    def load(cls, path: str | Path, **kwargs: Any) -> LearnedPolicy:
        return cls(load_saved_model(path), **kwargs)

    # -- Policy (bare simulator) ----------------------------------------------------------------
    def reset(self, sim: Simulator) -> None:
        self._sim = sim
        self._dp = None
        self._encoder = None

    def _encoder_for(self, n_calls: int) -> Encoder:
        enc = self._encoder
        if enc is not None and enc.k >= n_calls:
            return enc
        sim = self._sim
        n_p, n_d = len(sim.cluster.prefill), len(sim.cluster.decode)
        k = max(self.k or self.train_k, n_calls)
        if self.equivariant:
            p_max, d_max = n_p, n_d
        else:
            if n_p > self.train_p or n_d > self.train_d or k > self.train_k:
                raise ValueError(f"this MultiInputPolicy model was trained with K={self.train_k}"
                                 f", P_max={self.train_p}, D_max={self.train_d}; it cannot "
                                 f"schedule {n_calls} calls on a {n_p}P+{n_d}D cluster (the "
                                 f"equivariant policy can)")
            k, p_max, d_max = self.train_k, self.train_p, self.train_d
        self._encoder = Encoder(sim.cluster, sim.tables, k, p_max, d_max, self.time_scale)
        return self._encoder

    def pick(self, dp: DecisionPoint) -> tuple[int, int, int]:
        if self._sim is None:
            raise RuntimeError("LearnedPolicy.reset(sim) must run before pick(dp)")
        enc = self._encoder_for(len(dp.calls))
        if dp is not self._dp:
            self._dp = dp
            enc.begin(self._sim, dp, len(self._sim.workload.workflows))
            if self._workflow_obs:
                self._workflow = workflow_rows(dp.calls, enc.k, dp.now, 1.0 / self.time_scale)
        obs, mask = enc.observe()
        if self._workflow_obs:
            obs["workflow"] = self._workflow
        obs = self.known(obs)
        if self._fast:
            return enc.decode_action(self.policy.greedy_action(obs, mask))
        action, _ = self.predict(obs, action_masks=mask, deterministic=self.deterministic)
        return enc.decode_action(int(np.asarray(action).reshape(-1)[0]))

    # -- model interface (through an env) -------------------------------------------------------
    def predict(self, observation: dict[str, np.ndarray], state: Any = None,
                episode_start: Any = None, deterministic: bool = True,
                action_masks: np.ndarray | None = None) -> tuple[np.ndarray, Any]:
        """The model's ``predict`` (SB3 semantics; the equivariant policy takes any shapes).
        Observation keys the model was not trained on are ignored."""
        return self.policy.predict(self.known(observation), state, episode_start, deterministic,
                                   action_masks=action_masks)

    def known(self, observation: Any) -> Any:
        """``observation`` without the keys the model was not trained on (a Dict observation
        from a newer env); anything else unchanged."""
        if isinstance(observation, dict) and any(k not in self.keys for k in observation):
            return {k: observation[k] for k in self.keys}
        return observation

    def __repr__(self) -> str:
        kind = "equivariant" if self.equivariant else "mlp"
        return f"LearnedPolicy({kind}, trained K={self.train_k}, P={self.train_p}, " \
               f"D={self.train_d})"


__all__ = ["DEFAULT_MODEL", "MODELS_DIR", "N_DELTA", "N_HORIZON", "N_REL", "PHI_IS_BEST",
           "PHI_IS_TOP", "POLICY_CLASSES", "STATIC_INSTANCE_FEATURES", "WORKFLOW_COLUMNS",
           "DictPassThrough", "EquivariantNet", "EquivariantPolicy", "LearnedPolicy",
           "make_model"]
