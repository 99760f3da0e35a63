"""Learned schedulers: a permutation-equivariant MaskablePPO policy and a loader/wrapper.

The env's observation is a set of waiting calls, a set of prefill instances, a set of decode
instances and the projection tensor Δ over their triples (see ``envs/pd_cluster_env.py``). A
scheduler should not care in which slot a call or an instance sits, so :class:`EquivariantPolicy`
scores every triple with *shared* networks:

- per-call, per-prefill-instance and per-decode-instance embeddings from three shared MLPs (each
  row sees its own features, a few features relative to the set, e.g. its risk minus the largest
  risk of the window, and the globals), plus one DeepSets context layer over the calls;
- one logit per (slot, p, d) from a shared scorer over [call emb, prefill emb, decode emb,
  Δ features]; its first layer is split into per-part linear maps that are summed by
  broadcasting, which is the same function as a linear layer over the concatenation but costs
  O(K·H + P·H + D·H + M·S) for the M valid triples instead of O(K·P·D·3H);
- a value head over masked mean/max pools of the three embedding sets and the globals.

Two choices make it a good student of HexAgent that transfers (docs/learned.md has the
measurements): a linear skip path over two indicator features (the riskiest call, its argmin-Δ
pair) initialised at ``prior``, so the network is a residual on top of HexAgent's rule; and
instance identity features (GPU one-hots, sizes, static speeds) left out of the inputs, so the
scorer reads Δ instead of learning which copy the teacher picks on the training cluster.

Permuting call slots (or instances) permutes the logits the same way, padded or empty slots
change nothing, and no weight depends on K, P_max or D_max, so one trained policy runs on other
cluster sizes (:meth:`EquivariantPolicy.obs_to_tensor` accepts any shapes). Invalid triples are
left to MaskablePPO's masking. The plain ``MultiInputPolicy`` of sb3-contrib is the baseline
(:data:`POLICY_CLASSES`).

:class:`LearnedPolicy` wraps a trained model (or loads a ``.zip``) as a scheduler with both
``pick(dp)`` (bare simulator, what ``env.rollout`` uses for policy objects and what the evaluation
grid runs) and ``predict(obs, action_masks=...)``. Importing this module registers the policy
name ``learned`` (the shipped model under ``models/``) if that file exists and the name is free.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from torch import nn

from envs.encoding import CALL_FEATURES, DECODE_FEATURES, PREFILL_FEATURES, Encoder
from envs.rollout import load_saved_model

if TYPE_CHECKING:
    from hexagent_gym.decisions import DecisionPoint
    from hexagent_gym.simulator import Simulator

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"
DEFAULT_MODEL = MODELS_DIR / "learned_hetero1_bfcl.zip"
"""The shipped model (``models/README.md``): equivariant policy, cloned from HexAgent (+ DAgger)
and fine-tuned by PPO on hetero-1 / bfcl_v3."""

_C = {name: i for i, name in enumerate(CALL_FEATURES)}
_PRESENT, _PICKED, _AGE, _WAIT, _H_EST = (_C[n] for n in ("present", "picked", "age", "wait",
                                                          "h_est"))
_MIN_DELTA, _RISK = _C["min_delta"], _C["risk"]
STATIC_INSTANCE_FEATURES = tuple(dict.fromkeys(
    f for f in PREFILL_FEATURES + DECODE_FEATURES if f.startswith("gpu_"))) + (
    "capacity", "max_batch", "rel_time")
"""Instance features the policy leaves out by default: GPU identity, absolute sizes and static
speeds. On one training cluster they name the instances (in hetero-1 "gpu_h200", "capacity
1.17 M tokens" or "decode rel_time 1.0" *is* the fastest decode instance), so a scorer fit on
them learns which copy to pick instead of reading Δ, and fails on a cluster whose fastest GPU is
another one: behaviour-cloned on hetero-1, the placement agrees with HexAgent on 50% of
qwen-hetero-1's picks with every feature, 92% without GPU one-hots and sizes, and 100% without
``rel_time`` either (docs/learned.md). Δ already prices each instance's speed and load for the
call at hand; the dynamic load features (free time, queue, reservations, batch) stay."""
N_REL = 4
"""Per-call features relative to the window: risk − max, age − max, wait − max, min Δ − min."""
N_DELTA = 9
"""Per-triple Δ features (:meth:`EquivariantNet.delta_features`)."""
PHI_IS_BEST, PHI_IS_TOP = 7, 8
"""Columns of the two HexAgent indicators among the Δ features."""
_BIG = 1e9


def _expand(x: th.Tensor) -> th.Tensor:
    """Each feature twice: linear (clipped at 10) and log-compressed, so both small differences
    (a risk of 1.1 vs 1.3) and heavy tails (ages of 50 time units) stay visible."""
    x = x.clamp(min=0.0)
    return th.cat([x.clamp(max=10.0), th.log1p(x)], dim=-1)


def _mlp(n_in: int, hidden: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_out), nn.ReLU())


def _masked_pool(x: th.Tensor, mask: th.Tensor) -> th.Tensor:
    """[mean, max] of ``x`` (B, N, H) over rows where ``mask`` (B, N); zeros for empty sets."""
    m = mask.unsqueeze(-1).to(x.dtype)
    count = m.sum(dim=1).clamp(min=1.0)
    mean = (x * m).sum(dim=1) / count
    mx = th.where(mask.unsqueeze(-1), x, th.full_like(x, -_BIG)).amax(dim=1)
    mx = th.where(mask.any(dim=1, keepdim=True), mx, th.zeros_like(mx))
    return th.cat([mean, mx], dim=-1)


def _masked_extreme(x: th.Tensor, mask: th.Tensor, dims: tuple[int, ...],
                    largest: bool) -> th.Tensor:
    """Max (or min) of ``x`` over ``dims`` among ``mask``; 0 where nothing is valid."""
    fill = -_BIG if largest else _BIG
    y = th.where(mask, x, th.full_like(x, fill))
    y = y.amax(dim=dims, keepdim=True) if largest else y.amin(dim=dims, keepdim=True)
    return th.where(y.abs() < _BIG / 2, y, th.zeros_like(y))


class EquivariantNet(nn.Module):
    """Shared-weight scorer of (call, prefill, decode) triples and a pooled value head.

    Args:
        n_call, n_prefill, n_decode, n_global: feature counts of the observation's
            ``calls``, ``prefill``, ``decode`` rows and ``globals``.
        hidden: embedding width of calls and instances.
        score_hidden: hidden width of the triple scorer.
        value_hidden: hidden width of the value head.
    """

    def __init__(self, n_call: int, n_prefill: int, n_decode: int, n_global: int,
                 hidden: int = 64, score_hidden: int = 32, value_hidden: int = 64,
                 prior: float = 0.0, prefill_columns: list[int] | None = None,
                 decode_columns: list[int] | None = None) -> None:
        super().__init__()
        g = 2 * n_global
        self.prefill_columns = list(range(n_prefill)) if prefill_columns is None \
            else list(prefill_columns)
        self.decode_columns = list(range(n_decode)) if decode_columns is None \
            else list(decode_columns)
        n_prefill, n_decode = len(self.prefill_columns), len(self.decode_columns)
        self.call_mlp = _mlp(2 * n_call + N_REL + g, hidden, hidden)
        self.context_mlp = _mlp(3 * hidden, hidden, hidden)
        self.prefill_mlp = _mlp(2 * n_prefill + g, hidden, hidden)
        self.decode_mlp = _mlp(2 * n_decode + g, hidden, hidden)
        # first scorer layer over [call, prefill, decode, Δ features], split by part
        self.score_call = nn.Linear(hidden, score_hidden)
        self.score_prefill = nn.Linear(hidden, score_hidden, bias=False)
        self.score_decode = nn.Linear(hidden, score_hidden, bias=False)
        self.score_delta = nn.Linear(N_DELTA, score_hidden, bias=False)
        self.score_out = nn.Linear(score_hidden, 1)
        # linear paths: a risk-first, argmin-Δ ranking (HexAgent) is one weight vector away
        self.skip_delta = nn.Linear(N_DELTA, 1, bias=False)
        self.skip_call = nn.Linear(hidden, 1, bias=False)
        self.prior = float(prior)
        # log of a global logit scale (inverse temperature); 0 = scale 1. Behaviour cloning
        # leaves the policy nearly deterministic; imitation.calibrate_temperature lowers the
        # scale so PPO starts from HexAgent's argmax but still explores its runner-up picks.
        self.log_scale = nn.Parameter(th.zeros(()))
        self.value_mlp = nn.Sequential(_mlp(6 * hidden + g, value_hidden, value_hidden),
                                       nn.Linear(value_hidden, 1))

    @property
    def output_layers(self) -> tuple[nn.Module, ...]:
        return (self.score_out, self.skip_delta, self.skip_call)

    def init_prior(self) -> None:
        """Start the linear path at HexAgent: weight ``prior`` on each of the two indicators
        (the riskiest call; its argmin-Δ pair), so the untrained policy already prefers
        HexAgent's pick by a factor e^(2·prior) over an unrelated triple, and the rest of the
        network learns a residual on top of it (trainable, like every other weight)."""
        with th.no_grad():
            self.skip_delta.weight[0, PHI_IS_BEST] = self.prior
            self.skip_delta.weight[0, PHI_IS_TOP] = self.prior

    # -- pieces ---------------------------------------------------------------------------------
    @staticmethod
    def delta_features(calls: th.Tensor, delta: th.Tensor,
                       valid: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        """Per-triple features (B, K, P, D, N_DELTA), zero where invalid, and each call's
        relative risk (B, K) (its R minus the window's largest R, ≤ 0).

        Columns: Δ, log1p Δ, Δ − the call's min Δ, (Δ − min Δ) / min Δ (relative regret),
        Δ − the smallest Δ of the decision, R(c, p, d) = (age + Δ) / H_w(t), the call's
        relative risk, and two indicators: the pair is the call's argmin Δ, the call has the
        largest risk. HexAgent's pick is the triple with both indicators set, so the reference
        heuristic is one linear weight vector away and PPO learns where to deviate from it.
        """
        d = delta.clamp(min=0.0, max=100.0)
        any_valid = valid.flatten(2).any(dim=-1)  # (B, K) call has a valid pair
        dmin_c = _masked_extreme(d, valid, (2, 3), largest=False)  # (B, K, 1, 1)
        dmin_all = _masked_extreme(d, valid, (1, 2, 3), largest=False)
        age = calls[..., _AGE, None, None]
        h = calls[..., _H_EST, None, None].clamp(min=1e-4)
        risk_c = ((calls[..., _AGE] + dmin_c[..., 0, 0]) / calls[..., _H_EST].clamp(min=1e-4))
        risk_c = risk_c.clamp(max=100.0)
        top = _masked_extreme(risk_c, any_valid, (1,), largest=True)
        rel_risk = th.where(any_valid, (risk_c - top).clamp(min=-20.0), th.zeros_like(risk_c))
        feats = th.stack([
            d.clamp(max=20.0),
            th.log1p(d),
            (d - dmin_c).clamp(max=20.0),
            ((d - dmin_c) / (dmin_c + 0.05)).clamp(max=10.0),
            (d - dmin_all).clamp(max=20.0),
            ((age + d) / h).clamp(max=20.0),
            rel_risk[..., None, None].expand_as(d),
            (d - dmin_c <= 1e-6 * (1.0 + dmin_c)).to(d.dtype),
            (rel_risk >= -1e-6)[..., None, None].expand_as(d).to(d.dtype),
        ], dim=-1)
        return feats * valid.unsqueeze(-1).to(feats.dtype), rel_risk

    def embed(self, obs: dict[str, th.Tensor]) -> dict[str, th.Tensor]:
        """Embeddings and masks of calls (B, K, H), prefill (B, P, H), decode (B, D, H)."""
        calls, delta = obs["calls"], obs["delta"]
        g = _expand(obs["globals"])
        B, K = calls.shape[:2]
        valid = delta >= 0.0  # (B, K, P, D): what the env's mask allows
        live = (calls[..., _PRESENT] > 0.5) & (calls[..., _PICKED] < 0.5)
        phi, rel_risk = self.delta_features(calls, delta, valid)

        def rel(col: int, largest: bool) -> th.Tensor:
            x = calls[..., col]
            ext = _masked_extreme(x, live, (1,), largest=largest)
            return th.where(live, (x - ext).clamp(-20.0, 20.0), th.zeros_like(x))

        rel_feats = th.stack([rel_risk, rel(_AGE, True), rel(_WAIT, True),
                              rel(_MIN_DELTA, False)], dim=-1)
        e_c = self.call_mlp(th.cat([_expand(calls), rel_feats,
                                    g[:, None, :].expand(B, K, -1)], dim=-1))
        pooled = _masked_pool(e_c, live)
        e_c = e_c + self.context_mlp(th.cat([e_c, pooled[:, None, :].expand(B, K, -1)], dim=-1))

        pre, dec = obs["prefill"], obs["decode"]
        p_present, d_present = pre[..., 0] > 0.5, dec[..., 0] > 0.5
        pre, dec = pre[..., self.prefill_columns], dec[..., self.decode_columns]
        e_p = self.prefill_mlp(th.cat([_expand(pre), g[:, None, :].expand(B, pre.shape[1], -1)],
                                      dim=-1))
        e_d = self.decode_mlp(th.cat([_expand(dec), g[:, None, :].expand(B, dec.shape[1], -1)],
                                     dim=-1))
        return {"calls": e_c, "prefill": e_p, "decode": e_d, "globals": g, "phi": phi,
                "valid": valid, "live": live, "p_present": p_present, "d_present": d_present}

    def logits(self, emb: dict[str, th.Tensor]) -> th.Tensor:
        """One logit per triple, flattened as the env's actions: (B, K·P·D).

        Only valid triples (Δ ≥ 0, i.e. the env's mask) are scored, by gathering them: at a
        decision point most slots are empty or picked, and at the decode stage only the locked
        pair is valid, so this skips most of the K·P·D grid. Invalid triples get logit 0 and are
        masked by MaskablePPO.
        """
        e_c, e_p, e_d, phi = emb["calls"], emb["prefill"], emb["decode"], emb["phi"]
        valid = emb["valid"]
        b, k, p, d = valid.nonzero(as_tuple=True)
        f = phi[b, k, p, d]  # (M, N_DELTA)
        h = (self.score_call(e_c)[b, k] + self.score_prefill(e_p)[b, p]
             + self.score_decode(e_d)[b, d] + self.score_delta(f))
        scores = (self.score_out(th.relu(h)) + self.skip_delta(f)
                  + self.skip_call(e_c)[b, k]).squeeze(-1)
        out = e_c.new_zeros(valid.shape)
        out = out.index_put((b, k, p, d), scores * self.log_scale.exp())
        return out.flatten(1)

    def value(self, emb: dict[str, th.Tensor]) -> th.Tensor:
        """State value (B, 1) from pooled embeddings and the globals."""
        x = th.cat([_masked_pool(emb["calls"], emb["live"]),
                    _masked_pool(emb["prefill"], emb["p_present"]),
                    _masked_pool(emb["decode"], emb["d_present"]), emb["globals"]], dim=-1)
        return self.value_mlp(x)

    def forward(self, obs: dict[str, th.Tensor]) -> tuple[th.Tensor, th.Tensor]:
        emb = self.embed(obs)
        return self.logits(emb), self.value(emb)


class DictPassThrough(BaseFeaturesExtractor):
    """Hands the Dict observation to the policy unchanged (the policy does its own encoding)."""

    def __init__(self, observation_space: spaces.Dict) -> None:
        super().__init__(observation_space, features_dim=1)

    def forward(self, observations: dict[str, th.Tensor]) -> dict[str, th.Tensor]:
        return observations


class EquivariantPolicy(MaskableActorCriticPolicy):
    """MaskablePPO policy whose logits come from :class:`EquivariantNet`.

    Use ``MaskablePPO(EquivariantPolicy, env, policy_kwargs=dict(hidden=64))``; it saves and
    loads like any SB3 policy (``MaskablePPO.load(path)``; the class is importable from
    ``agents.learned``). ``net_arch`` and ``activation_fn`` are accepted for SB3 compatibility
    and ignored.

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
        ortho_init: orthogonal init (gain √2 hidden, 0.01 logits, 1 value), as SB3 does.
    """

    def __init__(self, observation_space: spaces.Dict, action_space: spaces.Discrete,
                 lr_schedule: Schedule, hidden: int = 64, score_hidden: int = 32,
                 value_hidden: int = 64, prior: float = 4.0,
                 exclude_features: tuple[str, ...] | list[str] = STATIC_INSTANCE_FEATURES,
                 ortho_init: bool = True, **kwargs: Any) -> None:
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
        self.arch = {"hidden": int(hidden), "score_hidden": int(score_hidden),
                     "value_hidden": int(value_hidden), "prior": float(prior),
                     "exclude_features": tuple(exclude_features)}
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
        logits, values = self.net(self._net_obs(obs))
        dist = self._distribution(logits, action_masks)
        actions = dist.get_actions(deterministic=deterministic)
        return actions.reshape((-1, *self.action_space.shape)), values, dist.log_prob(actions)

    def evaluate_actions(self, obs: dict[str, th.Tensor], actions: th.Tensor,
                         action_masks: th.Tensor | None = None
                         ) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
        logits, values = self.net(self._net_obs(obs))
        dist = self._distribution(logits, action_masks)
        return values, dist.log_prob(actions), dist.entropy()

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
        observation on the CPU, without SB3's distribution objects, at about 30 % less time per
        pick (docs/performance.md). It repeats sb3-contrib's arithmetic step for step, so
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


class LearnedPolicy:
    """A trained MaskablePPO model as a scheduler for ``env.rollout`` and the policy registry.

    ``pick(dp)`` encodes the decision point exactly as the env does (an
    :class:`~envs.encoding.Encoder` over the episode's simulator) and takes the model's
    deterministic choice among the valid actions, so ``env.rollout(LearnedPolicy(...))`` runs
    on the bare simulator and gives the same picks as ``env.rollout(model)`` through the env.
    ``predict`` forwards to the model (with masks), for code that steps an env.

    An equivariant model runs on any cluster and window (the encoder is sized to the episode);
    a ``MultiInputPolicy`` model needs the training shapes (smaller clusters are padded).

    Args:
        model: a MaskablePPO model, or a path to a saved one (``.zip``); None loads the shipped
            :data:`DEFAULT_MODEL`.
        k: call slots of the encoder (None: the model's training K, grown when a decision shows
            more calls, e.g. a simulator without a window).
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
        obs, mask = enc.observe()
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


__all__ = ["DEFAULT_MODEL", "STATIC_INSTANCE_FEATURES", "DictPassThrough", "EquivariantNet",
           "EquivariantPolicy", "LearnedPolicy", "POLICY_CLASSES", "make_model"]
