"""The permutation-equivariant scheduling network: shared-weight scores of (call, prefill,
decode) triples, a pooled value head, and the feature maps they read.

The env's observation is a set of waiting calls, a set of prefill instances, a set of decode
instances and the projection tensor Δ over their triples (see ``envs/pd_cluster_env.py``). A
scheduler should not care in which slot a call or an instance sits, so :class:`EquivariantNet`
scores every triple with *shared* networks:

- per-call, per-prefill-instance and per-decode-instance embeddings from three shared MLPs (each
  row sees its own features, a few features relative to the set, e.g. its risk minus the largest
  risk of the window, and the globals), plus one DeepSets context layer over the calls;
- one logit per (slot, p, d) from a shared scorer over [call emb, prefill emb, decode emb,
  Δ features]; its first layer is split into per-part linear maps that are summed by
  broadcasting, which is the same function as a linear layer over the concatenation but costs
  O(K·H + P·H + D·H + M·S) for the M valid triples instead of O(K·P·D·3H);
- a value head over masked mean/max pools of the three embedding sets and the globals.

A linear skip path over two indicator features (the riskiest call, its argmin-Δ pair) starts
at ``prior`` (:meth:`EquivariantNet.init_prior`), so the network is a residual on top of
HexAgent's rule. Instance identity features (:data:`STATIC_INSTANCE_FEATURES`) are meant to be
left out of the inputs (``prefill_columns`` / ``decode_columns``), so the scorer reads Δ instead
of learning which copy the teacher picks on the training cluster (docs/learned.md has the
measurements behind both choices).

Permuting call slots (or instances) permutes the logits the same way, padded or empty slots
change nothing, and no weight depends on K, P_max or D_max, so one set of weights runs on any
window and cluster size. The SB3 policy around it is ``agents/equivariant_policy.py``.
"""

from __future__ import annotations

import torch as th
from torch import nn
from torch.nn import functional as F

from hexagent_gym.envs.encoding import (
    CALL_FEATURES,
    DECODE_FEATURES,
    PREFILL_FEATURES,
    WORKFLOW_FEATURES,
)

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
another one (docs/learned.md, "Excluded instance features", measures the agreement with HexAgent
with and without them). Δ already prices each instance's speed and load for the call at hand;
the dynamic load features (free time, queue, reservations, batch) stay."""
N_REL = 4
"""Per-call features relative to the window: risk − max, age − max, wait − max, min Δ − min."""
N_DELTA = 9
"""Per-triple Δ features (:meth:`EquivariantNet.delta_features`)."""
PHI_IS_BEST, PHI_IS_TOP = 7, 8
"""Columns of the two HexAgent indicators among the Δ features."""
WORKFLOW_COLUMNS = tuple(WORKFLOW_FEATURES.index(f) for f in (
    "h_pred", "horizon", "age_over_horizon", "first_prompt", "revealed"))
"""Columns of ``obs["workflow"]`` the network reads with ``workflow_feature``. The hashed
application id (``app_i``) is left out: bucket numbers name applications of one trace, so a
scorer fit on them would not transfer to another trace family; the forecast Ĥ_w carries what the
id predicts."""
N_HORIZON = 3
"""Per-triple features added by ``workflow_feature`` (:meth:`EquivariantNet.horizon_features`):
(age + Δ) / max(H_w(t), Ĥ_w), the call's relative horizon risk, and its top indicator."""
_W_HORIZON = WORKFLOW_FEATURES.index("horizon")
_BIG = 1e9


def _expand(x: th.Tensor) -> th.Tensor:
    """Each feature twice: linear (clipped at 10) and log-compressed, so both small differences
    (a risk of 1.1 vs 1.3) and heavy tails (ages of 50 time units) stay visible."""
    x = x.clamp(min=0.0)
    return th.cat([x.clamp(max=10.0), th.log1p(x)], dim=-1)


def _mlp(n_in: int, hidden: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_out), nn.ReLU())


def _run(seq: nn.Sequential, x: th.Tensor) -> th.Tensor:
    """``seq(x)`` for a Sequential of Linear and ReLU layers (nested ones too), calling the
    torch functions the layers call without a Module call per layer: the same arithmetic, and
    at a rollout step (two observations) those calls cost about as much as the layers."""
    for layer in seq:
        kind = type(layer)
        if kind is nn.Linear:
            x = F.linear(x, layer.weight, layer.bias)
        elif kind is nn.ReLU and not layer.inplace:
            x = th.relu(x)
        elif kind is nn.Sequential:
            x = _run(layer, x)
        else:
            x = layer(x)
    return x


def _masked_pool(x: th.Tensor, mask: th.Tensor) -> th.Tensor:
    """[mean, max] of ``x`` (B, N, H) over rows where ``mask`` (B, N); zeros for empty sets."""
    m = mask.unsqueeze(-1).to(x.dtype)
    count = m.sum(dim=1).clamp(min=1.0)
    mean = (x * m).sum(dim=1) / count
    mx = th.where(mask.unsqueeze(-1), x, -_BIG).amax(dim=1)
    mx = th.where(mask.any(dim=1, keepdim=True), mx, 0.0)
    return th.cat([mean, mx], dim=-1)


def _masked_extreme(x: th.Tensor, mask: th.Tensor, dims: tuple[int, ...],
                    largest: bool) -> th.Tensor:
    """Max (or min) of ``x`` over ``dims`` among ``mask``; 0 where nothing is valid."""
    y = th.where(mask, x, -_BIG if largest else _BIG)
    y = y.amax(dim=dims, keepdim=True) if largest else y.amin(dim=dims, keepdim=True)
    return th.where(y.abs() < _BIG / 2, y, 0.0)


class EquivariantNet(nn.Module):
    """Shared-weight scorer of (call, prefill, decode) triples and a pooled value head.

    Args:
        n_call, n_prefill, n_decode, n_global: feature counts of the observation's
            ``calls``, ``prefill``, ``decode`` rows and ``globals``.
        hidden: embedding width of calls and instances.
        score_hidden: hidden width of the triple scorer.
        value_hidden: hidden width of the value head.
        prior: weight :meth:`init_prior` puts on the two HexAgent indicators (0: none).
        prefill_columns, decode_columns: indices of the ``prefill`` / ``decode`` features the
            network reads (None: all); the first column (``present``) marks padding and is
            always read for masking.
        cache_feature: append the cache affinity ``cached[c, p]`` (the fraction of call c's
            prompt in prefill instance p's prefix cache, from the observation) to each triple's
            Δ features. Δ already prices the hit in this call's prefill time; the affinity
            also tells where the workflow's prompt stays warm for its next calls. Off by
            default, so models saved without it load unchanged.
        workflow_feature: read the observation's ``workflow`` key (``workflow_obs=True``: each
            call's workflow as a front end knows it, docs/horizons.md): its
            :data:`WORKFLOW_COLUMNS` join the call embedding's inputs, and each triple gets the
            :data:`N_HORIZON` features of ``hexagent-horizon``'s risk, whose denominator is
            max(H_w(t), Ĥ_w). :meth:`init_prior` then starts from that rule (the riskiest call
            by the forecast horizon) instead of HexAgent's. Off by default.
    """

    def __init__(self, n_call: int, n_prefill: int, n_decode: int, n_global: int,
                 hidden: int = 64, score_hidden: int = 32, value_hidden: int = 64,
                 prior: float = 0.0, prefill_columns: list[int] | None = None,
                 decode_columns: list[int] | None = None, cache_feature: bool = False,
                 workflow_feature: bool = False) -> None:
        super().__init__()
        self.cache_feature = bool(cache_feature)
        self.workflow_feature = bool(workflow_feature)
        n_wf = 2 * len(WORKFLOW_COLUMNS) if self.workflow_feature else 0
        n_phi = N_DELTA + N_HORIZON * int(self.workflow_feature) + int(self.cache_feature)
        g = 2 * n_global
        self.prefill_columns = list(range(n_prefill)) if prefill_columns is None \
            else list(prefill_columns)
        self.decode_columns = list(range(n_decode)) if decode_columns is None \
            else list(decode_columns)
        n_prefill, n_decode = len(self.prefill_columns), len(self.decode_columns)
        # the same columns as index tensors (index_select is cheaper than indexing by a list)
        self.register_buffer("_prefill_index", th.tensor(self.prefill_columns, dtype=th.long),
                             persistent=False)
        self.register_buffer("_decode_index", th.tensor(self.decode_columns, dtype=th.long),
                             persistent=False)
        self.register_buffer("_workflow_index", th.tensor(WORKFLOW_COLUMNS, dtype=th.long),
                             persistent=False)
        self.call_mlp = _mlp(2 * n_call + N_REL + g + n_wf, hidden, hidden)
        self.context_mlp = _mlp(3 * hidden, hidden, hidden)
        self.prefill_mlp = _mlp(2 * n_prefill + g, hidden, hidden)
        self.decode_mlp = _mlp(2 * n_decode + g, hidden, hidden)
        # first scorer layer over [call, prefill, decode, Δ features], split by part
        self.score_call = nn.Linear(hidden, score_hidden)
        self.score_prefill = nn.Linear(hidden, score_hidden, bias=False)
        self.score_decode = nn.Linear(hidden, score_hidden, bias=False)
        self.score_delta = nn.Linear(n_phi, score_hidden, bias=False)
        self.score_out = nn.Linear(score_hidden, 1)
        # linear paths: a risk-first, argmin-Δ ranking (HexAgent) is one weight vector away
        self.skip_delta = nn.Linear(n_phi, 1, bias=False)
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
        network learns a residual on top of it (trainable, like every other weight).

        With ``workflow_feature`` the second indicator is the call with the largest risk under
        the forecast horizon (``hexagent-horizon``'s pick) and HexAgent's own gets no weight.
        """
        top = N_DELTA + 2 if self.workflow_feature else PHI_IS_TOP
        with th.no_grad():
            self.skip_delta.weight[0, PHI_IS_BEST] = self.prior
            self.skip_delta.weight[0, top] = self.prior

    # -- pieces ---------------------------------------------------------------------------------
    @staticmethod
    def _delta_parts(calls: th.Tensor, delta: th.Tensor, valid: th.Tensor
                     ) -> tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor]:
        """(Δ clipped to [0, 100], each call's min Δ (B, K, 1, 1), the decision's min Δ
        (B, 1, 1, 1), each call's relative risk (B, K)) over the valid triples."""
        d = delta.clamp(min=0.0, max=100.0)
        any_valid = valid.flatten(2).any(dim=-1)  # (B, K) call has a valid pair
        dmin_c = _masked_extreme(d, valid, (2, 3), largest=False)  # (B, K, 1, 1)
        dmin_all = _masked_extreme(d, valid, (1, 2, 3), largest=False)
        risk_c = ((calls[..., _AGE] + dmin_c[..., 0, 0]) / calls[..., _H_EST].clamp(min=1e-4))
        risk_c = risk_c.clamp(max=100.0)
        top = _masked_extreme(risk_c, any_valid, (1,), largest=True)
        rel_risk = th.where(any_valid, (risk_c - top).clamp(min=-20.0), 0.0)
        return d, dmin_c, dmin_all, rel_risk

    @staticmethod
    def _stack_features(d: th.Tensor, dmin_c: th.Tensor, dmin_all: th.Tensor, age: th.Tensor,
                        h: th.Tensor, rel_risk: th.Tensor) -> th.Tensor:
        """The N_DELTA columns of :meth:`delta_features` from broadcastable parts."""
        gap = d - dmin_c
        return th.stack([
            d.clamp(max=20.0),
            th.log1p(d),
            gap.clamp(max=20.0),
            (gap / (dmin_c + 0.05)).clamp(max=10.0),
            (d - dmin_all).clamp(max=20.0),
            ((age + d) / h).clamp(max=20.0),
            rel_risk.expand_as(d),
            (gap <= 1e-6 * (1.0 + dmin_c)).to(d.dtype),
            (rel_risk >= -1e-6).expand_as(d).to(d.dtype),
        ], dim=-1)

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

        The network computes these columns for the valid triples only
        (:meth:`valid_delta_features`, the same numbers); this full grid is the reference.
        """
        d, dmin_c, dmin_all, rel_risk = EquivariantNet._delta_parts(calls, delta, valid)
        feats = EquivariantNet._stack_features(
            d, dmin_c, dmin_all, calls[..., _AGE, None, None],
            calls[..., _H_EST, None, None].clamp(min=1e-4), rel_risk[..., None, None])
        return feats * valid.unsqueeze(-1).to(feats.dtype), rel_risk

    @staticmethod
    def valid_delta_features(calls: th.Tensor, delta: th.Tensor, valid: th.Tensor
                             ) -> tuple[th.Tensor, th.Tensor, tuple[th.Tensor, ...]]:
        """:meth:`delta_features` at the valid triples only: (features (M, N_DELTA), relative
        risk (B, K), the triples' indices (b, k, p, d) in ``valid.nonzero`` order).

        The same numbers as ``delta_features(...)[0][b, k, p, d]``, computed on M rows instead
        of the B·K·P·D grid (at a decision point a few percent of the grid is valid: most slots
        are empty or picked, and a decode stage has one valid pair), which is most of the
        forward pass of a PPO minibatch.
        """
        d, dmin_c, dmin_all, rel_risk = EquivariantNet._delta_parts(calls, delta, valid)
        index = valid.nonzero(as_tuple=True)
        b, k = index[0], index[1]
        feats = EquivariantNet._stack_features(
            d[index], dmin_c[b, k, 0, 0], dmin_all[b, 0, 0, 0], calls[b, k, _AGE],
            calls[b, k, _H_EST].clamp(min=1e-4), rel_risk[b, k])
        return feats, rel_risk, index

    @staticmethod
    def horizon_features(calls: th.Tensor, delta: th.Tensor, valid: th.Tensor,
                         workflow: th.Tensor, index: tuple[th.Tensor, ...]) -> th.Tensor:
        """The :data:`N_HORIZON` features of the valid triples ``index`` (M, N_HORIZON):
        (age + Δ) / H where H = max(H_w(t), Ĥ_w) is the ``workflow`` key's ``horizon``
        column, the call's risk (age + min Δ) / H minus the window's largest, and the indicator
        that the call has the largest such risk (``hexagent-horizon``'s choice of call)."""
        d = delta.clamp(min=0.0, max=100.0)
        any_valid = valid.flatten(2).any(dim=-1)
        dmin_c = _masked_extreme(d, valid, (2, 3), largest=False)[..., 0, 0]  # (B, K)
        h = workflow[..., _W_HORIZON].clamp(min=1e-4)  # padded rows are 0
        risk = ((calls[..., _AGE] + dmin_c) / h).clamp(max=100.0)
        top = _masked_extreme(risk, any_valid, (1,), largest=True)
        rel = th.where(any_valid, (risk - top).clamp(min=-20.0), 0.0)
        b, k = index[0], index[1]
        return th.stack([((calls[b, k, _AGE] + d[index]) / h[b, k]).clamp(max=20.0), rel[b, k],
                         (rel[b, k] >= -1e-6).to(d.dtype)], dim=-1)

    def embed(self, obs: dict[str, th.Tensor]) -> dict[str, th.Tensor]:
        """Embeddings and masks of calls (B, K, H), prefill (B, P, H), decode (B, D, H); the
        valid triples' indices (``index``) and Δ features (``phi``, (M, N_DELTA), then the
        :data:`N_HORIZON` columns with ``workflow_feature``, then the cache affinity column with
        ``cache_feature``)."""
        calls, delta = obs["calls"], obs["delta"]
        g = _expand(obs["globals"])
        B, K = calls.shape[:2]
        valid = delta >= 0.0  # (B, K, P, D): what the env's mask allows
        live = (calls[..., _PRESENT] > 0.5) & (calls[..., _PICKED] < 0.5)
        phi, rel_risk, index = self.valid_delta_features(calls, delta, valid)
        if self.workflow_feature:
            wf = obs["workflow"]
            phi = th.cat([phi, self.horizon_features(calls, delta, valid, wf, index)], dim=-1)
        if self.cache_feature:
            affinity = obs["cached"][index[0], index[1], index[2]]  # (M,): cached[b, k, p]
            phi = th.cat([phi, affinity.unsqueeze(-1)], dim=-1)

        def rel(col: int, largest: bool) -> th.Tensor:
            x = calls[..., col]
            ext = _masked_extreme(x, live, (1,), largest=largest)
            return th.where(live, (x - ext).clamp(-20.0, 20.0), 0.0)

        rel_feats = th.stack([rel_risk, rel(_AGE, True), rel(_WAIT, True),
                              rel(_MIN_DELTA, False)], dim=-1)
        parts = [_expand(calls), rel_feats, g[:, None, :].expand(B, K, -1)]
        if self.workflow_feature:
            parts.append(_expand(obs["workflow"].index_select(-1, self._workflow_index)))
        e_c = _run(self.call_mlp, th.cat(parts, dim=-1))
        pooled = _masked_pool(e_c, live)
        e_c = e_c + _run(self.context_mlp,
                         th.cat([e_c, pooled[:, None, :].expand(B, K, -1)], dim=-1))

        pre, dec = obs["prefill"], obs["decode"]
        p_present, d_present = pre[..., 0] > 0.5, dec[..., 0] > 0.5
        pre = pre.index_select(-1, self._prefill_index)
        dec = dec.index_select(-1, self._decode_index)
        e_p = _run(self.prefill_mlp,
                   th.cat([_expand(pre), g[:, None, :].expand(B, pre.shape[1], -1)], dim=-1))
        e_d = _run(self.decode_mlp,
                   th.cat([_expand(dec), g[:, None, :].expand(B, dec.shape[1], -1)], dim=-1))
        return {"calls": e_c, "prefill": e_p, "decode": e_d, "globals": g, "phi": phi,
                "index": index, "valid": valid, "live": live, "p_present": p_present,
                "d_present": d_present}

    def logits(self, emb: dict[str, th.Tensor]) -> th.Tensor:
        """One logit per triple, flattened as the env's actions: (B, K·P·D).

        Only valid triples (Δ ≥ 0, i.e. the env's mask) are scored, by gathering them: at a
        decision point most slots are empty or picked, and at the decode stage only the locked
        pair is valid, so this skips most of the K·P·D grid. Invalid triples get logit 0 and are
        masked by MaskablePPO.
        """
        e_c, e_p, e_d, f = emb["calls"], emb["prefill"], emb["decode"], emb["phi"]
        valid = emb["valid"]
        b, k, p, d = emb["index"]  # the valid triples; f: their features (M, N_DELTA)
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
        return _run(self.value_mlp, x)

    def forward(self, obs: dict[str, th.Tensor]) -> tuple[th.Tensor, th.Tensor]:
        emb = self.embed(obs)
        return self.logits(emb), self.value(emb)


__all__ = ["N_DELTA", "N_HORIZON", "N_REL", "PHI_IS_BEST", "PHI_IS_TOP",
           "STATIC_INSTANCE_FEATURES", "WORKFLOW_COLUMNS", "EquivariantNet"]
