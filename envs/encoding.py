"""Fixed-shape observations, joint action masks and action decoding for PDClusterEnv.

Everything here reads only scheduler-visible state: the decision point (its window of calls, Ŝ and
the projections Δ), the live instances and the workflows' *estimated* horizons. True output lengths
and true horizons never reach an observation.

Shapes are fixed by ``K`` (call slots), ``P_max`` and ``D_max`` (instance slots); rows beyond the
live window or the cluster are padding (``present = 0``, Δ = :data:`DELTA_MASKED`). The feature
lists below are the spec; :class:`~hexagent_gym.envs.pd_cluster_env.PDClusterEnv` documents units
and ranges. The ``cached`` key (K, P_max) is the fraction of each call's prompt found in each
prefill instance's prefix cache at the decision (0 at the decode stage, with the cache off and for
padding); a policy trained without it ignores it (``hexagent_gym.agents.learned`` reads keys by
name).

Cost notes: per-decision-point features (call lengths, ages, live instance state) are computed once
when a decision point opens; each step only refreshes what a pick changes (Δ, picked flags, Ŝ's
prefill free times and decode reservations). Observations are always fresh arrays.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium import spaces

from hexagent_gym.planning import kernels
from hexagent_gym.planning.decisions import Stage

if TYPE_CHECKING:
    from hexagent_gym.cluster.cluster import ClusterSpec
    from hexagent_gym.planning.cluster_tables import ClusterTables
    from hexagent_gym.planning.decisions import DecisionPoint
    from hexagent_gym.planning.entities import Call, DecodeInstance, PrefillInstance
    from hexagent_gym.sim.simulator import Simulator

# Enum members as module constants: CPython 3.11 reads `Stage.X` through EnumType's slow
# attribute hook (about 80 ns each), and these run several times per env step.
_STAGE_DECODE = Stage.DECODE

CLIP = 100.0
"""Upper bound of every normalised feature (times in ``time_scale`` units, ratios)."""
DELTA_MASKED = -1.0
"""Δ entry of an invalid (slot, p, d): empty or picked slot, padded instance, KV cannot fit, or not
the call's locked pair at the decode stage. Valid entries are ≥ 0."""
LOG_TOKENS = 10.0
"""Token counts are encoded as ``log1p(tokens) / LOG_TOKENS`` (1e6 tokens ≈ 1.38)."""
REF_PROMPT = 2048
"""Prompt length (tokens) at which instance speeds are compared for ``rel_time``."""
GPU_VOCAB = ("a100", "h100", "h200", "b200", "h20", "l40s")
"""GPU types with a one-hot column; any other GPU sets the ``gpu_other`` column. Fixed for v0 so
adding a GPU YAML does not change the observation shape."""

_GPU_COLS = tuple(f"gpu_{g}" for g in GPU_VOCAB) + ("gpu_other",)

CALL_FEATURES = (
    "present", "picked", "age", "wait", "h_est", "age_over_h_est", "l_in", "l_out_pred",
    "est_duration", "wf_done", "wf_service", "wf_open", "min_delta", "risk",
)
PREFILL_FEATURES = ("present", "free_in", "queue_len", "running", "rel_time") + _GPU_COLS
DECODE_FEATURES = (
    "present", "committed_kv", "committed_count", "batch", "waiting", "capacity", "max_batch",
    "rel_time",
) + _GPU_COLS
GLOBAL_FEATURES = (
    "stage", "now", "window", "unpicked", "beyond_window", "arrived", "finished", "in_system",
    "picks",
)

APP_BUCKETS = 8
"""Hash buckets of the application id in the ``workflow`` key (a fixed width for v0)."""
WORKFLOW_FEATURES = (
    "present", "h_pred", "horizon", "age_over_horizon", "first_prompt", "revealed",
) + tuple(f"app_{i}" for i in range(APP_BUCKETS))
"""The opt-in ``workflow`` key (``workflow_obs=True``), one row per call slot: what a front end
knows of the call's workflow (docs/horizons.md). ``h_pred``: the episode's forecast Ĥ_w of the
final horizon (0 without a ``horizon_predictor``); ``horizon``: max(H_w(t), Ĥ_w), the
denominator of ``hexagent-horizon``; ``age_over_horizon``: the workflow's age over it;
``first_prompt``: the first call's prompt tokens; ``revealed``: log1p(calls revealed); ``app_i``:
a one-hot of the application id's CRC-32 modulo :data:`APP_BUCKETS` (all 0 without an id)."""


def workflow_rows(calls: list[Call], k: int, now: float, inv: float) -> np.ndarray:
    """The ``workflow`` key's (k, len(WORKFLOW_FEATURES)) rows for a decision's window."""
    out = np.zeros((k, len(WORKFLOW_FEATURES)), dtype=np.float32)
    for i, c in enumerate(calls[:k]):
        w = c.workflow
        horizon = max(w.h_est, w.h_pred)
        app = w.spec.app_id
        row = out[i]
        row[:6] = (1.0, min(w.h_pred * inv, CLIP), min(horizon * inv, CLIP),
                   min((now - w.arrival) / horizon, CLIP) if horizon > 0.0 else CLIP,
                   _tok(w.spec.calls[0].input_tokens),
                   math.log1p(w.num_done + len(w.open_calls)))
        if app:
            row[6 + zlib.crc32(app.encode()) % APP_BUCKETS] = 1.0
    return out


# column indices used on the hot path
_C = {name: i for i, name in enumerate(CALL_FEATURES)}
_C_PICKED, _C_MIN, _C_RISK = _C["picked"], _C["min_delta"], _C["risk"]
_P_FREE, _P_QUEUE, _P_RUNNING = (PREFILL_FEATURES.index(x)
                                  for x in ("free_in", "queue_len", "running"))
_D_KV, _D_COUNT, _D_BATCH, _D_WAITING = (DECODE_FEATURES.index(x) for x in (
    "committed_kv", "committed_count", "batch", "waiting"))
_G_UNPICKED, _G_PICKS = GLOBAL_FEATURES.index("unpicked"), GLOBAL_FEATURES.index("picks")
_STEP_COLS = (_C_PICKED, _C_MIN, _C_RISK, _P_FREE, _D_KV, _D_COUNT, _G_UNPICKED,
              _G_PICKS)  # kernels.observe_step's order
_BEGIN_COLS = (_P_QUEUE, _P_RUNNING, _D_BATCH, _D_WAITING)  # begin_rows' order


def _tok(x: float) -> float:
    return math.log1p(x) / LOG_TOKENS


def _gpu_onehot(gpu: str) -> list[float]:
    row = [0.0] * len(_GPU_COLS)
    row[GPU_VOCAB.index(gpu) if gpu in GPU_VOCAB else len(GPU_VOCAB)] = 1.0
    return row


class MaskedDiscrete(spaces.Discrete):
    """``Discrete(n)`` whose ``sample()`` without a mask draws uniformly from the currently valid
    actions (as ``sample(mask=env.action_masks())``), so generic tools that sample random actions
    (``check_env``, random-agent loops) exercise the env instead of hitting invalid actions.

    ``contains``, equality, ``sample(mask=...)`` and pickling behave as ``Discrete``; a pickled
    copy (e.g. in a SubprocVecEnv parent) has no mask source and samples like ``Discrete``.
    """

    def __init__(self, n: int, mask_source: Callable[[], np.ndarray] | None = None,
                 seed: int | np.random.Generator | None = None) -> None:
        super().__init__(n, seed=seed)
        self.mask_source = mask_source

    def sample(self, mask: np.ndarray | None = None,
               probability: np.ndarray | None = None) -> np.int64:
        if mask is None and probability is None and self.mask_source is not None:
            valid = self.mask_source()
            if valid.any():
                return super().sample(mask=valid.view(np.int8))
        return super().sample(mask=mask, probability=probability)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["mask_source"] = None  # a bound method of the env: not shipped across processes
        return state

    def __repr__(self) -> str:
        return f"MaskedDiscrete({self.n})"


class Encoder:
    """Builds the observation and the joint action mask of a decision point.

    Args:
        cluster: the episode cluster (instance GPU types and speeds).
        tables: its precomputed tables (speeds, capacities).
        k: call slots K.
        p_max: prefill instance slots (≥ the cluster's prefill count).
        d_max: decode instance slots (≥ the cluster's decode count).
        time_scale: seconds per unit of every time feature.
    """

    def __init__(self, cluster: ClusterSpec, tables: ClusterTables, k: int, p_max: int,
                 d_max: int, time_scale: float) -> None:
        self.k, self.p_max, self.d_max = k, p_max, d_max
        self.num_prefill, self.num_decode = tables.num_prefill, tables.num_decode
        self.inv_ts = 1.0 / time_scale
        self.num_actions = k * p_max * d_max
        self._pd = p_max * d_max
        f32 = np.float32

        def box(shape: tuple[int, ...], low: float) -> spaces.Box:
            return spaces.Box(low=low, high=CLIP, shape=shape, dtype=f32)

        self.observation_space = spaces.Dict({
            "calls": box((k, len(CALL_FEATURES)), 0.0),
            "delta": box((k, p_max, d_max), DELTA_MASKED),
            "prefill": box((p_max, len(PREFILL_FEATURES)), 0.0),
            "decode": box((d_max, len(DECODE_FEATURES)), 0.0),
            "globals": box((len(GLOBAL_FEATURES),), 0.0),
            "cached": box((k, p_max), 0.0),  # values in [0, 1]; the bound is CLIP like the rest
        })
        # static instance features (present, speed, GPU type, capacity)
        P, D = self.num_prefill, self.num_decode
        pf_ref = np.asarray(tables.prefill_times(REF_PROMPT)[0])
        self._prefill_static = np.zeros((p_max, len(PREFILL_FEATURES)), dtype=f32)
        for i, spec in enumerate(cluster.prefill):
            row = [1.0, 0.0, 0.0, 0.0, pf_ref[i] / pf_ref.min()] + _gpu_onehot(spec.gpu)
            self._prefill_static[i] = row
        dec_ref = tables.dec_base[:, 1] + tables.dec_slope[:, 1] * REF_PROMPT
        self._decode_static = np.zeros((d_max, len(DECODE_FEATURES)), dtype=f32)
        for i, spec in enumerate(cluster.decode):
            row = [1.0, 0.0, 0.0, 0.0, 0.0, _tok(spec.kv_capacity_tokens),
                   _tok(spec.max_batch_size), dec_ref[i] / dec_ref.min()] + _gpu_onehot(spec.gpu)
            self._decode_static[i] = row
        np.minimum(self._prefill_static, CLIP, out=self._prefill_static)
        np.minimum(self._decode_static, CLIP, out=self._decode_static)
        self._capacity = tables.capacity.tolist()  # Python floats: observe() reads them in lists
        self._max_batch = tables.max_batch.astype(np.float64).tolist()
        self._padded = p_max != P or d_max != D
        self._pd_live = P * D
        self._grid_blank = np.full((k, p_max, d_max), DELTA_MASKED, dtype=f32)
        self._mask_blank = np.zeros(self.num_actions, dtype=bool)
        self._cached_empty = np.zeros((k, p_max), dtype=f32)
        # per-decision-point caches, filled by begin()
        self._dp: DecisionPoint | None = None
        self._calls = np.zeros((k, len(CALL_FEATURES)), dtype=f32)
        self._prefill = self._prefill_static.copy()
        self._decode = self._decode_static.copy()
        self._globals = np.zeros(len(GLOBAL_FEATURES), dtype=f32)
        self._cached = self._cached_empty.copy()
        self._rows_used = 0  # window rows begin() last wrote (begin_rows clears them)
        self._age: list[float] = []
        self._h_est: list[float] = []

    # -- actions --------------------------------------------------------------------------------
    def decode_action(self, action: int) -> tuple[int, int, int]:
        """Action index → (call slot, prefill instance, decode instance)."""
        slot, rest = divmod(action, self._pd)
        p, d = divmod(rest, self.d_max)
        return slot, p, d

    def encode_action(self, slot: int, p: int, d: int) -> int:
        """(call slot, prefill instance, decode instance) → action index."""
        if not (0 <= slot < self.k and 0 <= p < self.p_max and 0 <= d < self.d_max):
            raise ValueError(f"(slot={slot}, p={p}, d={d}) is outside the action grid "
                             f"K={self.k} × P_max={self.p_max} × D_max={self.d_max}")
        return (slot * self.p_max + p) * self.d_max + d

    # -- observations ---------------------------------------------------------------------------
    def begin(self, sim: Simulator, dp: DecisionPoint, num_workflows: int) -> tuple[int, int]:
        """Compute the features that stay fixed while the decision point is being picked.

        Returns (prefill instances running a prefill, calls in decode batches), read from the
        instances on the way: the step's info takes them
        (``hexagent_gym.envs.render.step_info``)."""
        self._dp = dp
        now = dp.now
        n = len(dp.calls)
        stage = dp.stage
        arrived = len(sim.workflows)
        finished = len(sim.finished)
        glob = (float(stage), min(now * self.inv_ts, CLIP), n / self.k, 0.0,
                math.log1p(max(sim.num_waiting(stage) - n, 0)), arrived / num_workflows,
                finished / num_workflows, math.log1p(arrived - finished), 0.0)
        # written in place (observe copies them): begin_rows rewrites every row of the window
        # and every live instance's columns and clears the previous window's rows. The
        # prefix-cache hit fractions are fixed within a decision (caches change only between
        # them); they are read from the calls' views, not dp.cached, so dp.batch is not built.
        rows = kernels.begin_rows if kernels.begin_rows is not None else _begin_rows_python
        self._age, self._h_est, running, batched = rows(
            dp.calls, stage == _STAGE_DECODE, now, self.inv_ts, CLIP, LOG_TOKENS, self._calls,
            self._cached, self._rows_used, sim.prefill, self._prefill, sim.decode, self._decode,
            self._max_batch, _BEGIN_COLS, self._globals, glob)
        self._rows_used = n
        return running, batched

    def observe(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Observation and flat joint mask (bool, length K·P_max·D_max) of the open decision
        point under the current Ŝ (call :meth:`begin` first); fresh arrays every call.

        This runs on every step. With the compiled kernels built, one ``kernels.observe_step``
        call builds it all (numpy's fixed cost per array operation is most of a step's
        observation in Python); without them, a fixed number of numpy calls
        (:meth:`_delta_grid`) and short Python lists (cheaper than numpy calls at these sizes).
        Both do the same float64 operations, so the values are the same."""
        dp = self._dp
        assert dp is not None, "begin() must run before observe()"
        state = dp.state
        if kernels.observe_step is not None:
            return kernels.observe_step(
                dp.delta, dp.picked, self._age, self._h_est, state.free_l, state.dec_tokens_l,
                state.dec_count_l, self._capacity, self._max_batch, self._calls, self._prefill,
                self._decode, self._globals, self._cached, self._grid_blank, self.inv_ts, CLIP,
                dp.now, len(dp.plan), _STEP_COLS)
        P, D = self.num_prefill, self.num_decode
        inv = self.inv_ts
        delta = dp.delta  # (n, P, D) seconds from now, inf = invalid; the core's cached array
        n = delta.shape[0]
        grid, mask = self._grid_blank.copy(), self._mask_blank.copy()
        best = self._delta_grid(delta, grid, mask)
        calls = self._calls.copy()
        now = dp.now
        pre = self._prefill.copy()
        dec = self._decode.copy()
        calls[:n, _C_PICKED] = dp.picked
        calls[:n, _C_MIN] = [min(b * inv, CLIP) for b in best]
        calls[:n, _C_RISK] = [min((a + b) / h, CLIP)
                              for a, b, h in zip(self._age, best, self._h_est, strict=True)]
        pre[:P, _P_FREE] = [min((f - now) * inv, CLIP) for f in state.free_l]  # free >= now
        dec[:D, _D_KV] = [min(x / c, CLIP)
                          for x, c in zip(state.dec_tokens_l, self._capacity, strict=True)]
        dec[:D, _D_COUNT] = [min(x / m, CLIP)
                             for x, m in zip(state.dec_count_l, self._max_batch, strict=True)]
        glob = self._globals.copy()
        picks = len(dp.plan)
        glob[_G_UNPICKED] = (n - picks) / self.k
        glob[_G_PICKS] = picks / self.k

        obs = {"calls": calls, "delta": grid, "prefill": pre, "decode": dec, "globals": glob,
               "cached": self._cached.copy()}
        return obs, mask

    def _delta_grid(self, delta: np.ndarray, grid: np.ndarray, mask: np.ndarray) -> list[float]:
        """Write into the blank ``grid`` (K, P_max, D_max; every entry DELTA_MASKED) the
        scaled, clipped valid entries of ``delta`` (n, P, D), and into the blank (all False)
        ``mask`` where they are; return each row's smallest Δ (inf: no valid pair). The
        reference of ``kernels.observe_step``'s grid."""
        P, D, pd = self.num_prefill, self.num_decode, self._pd_live
        n = delta.shape[0]
        flat = delta.reshape(n, pd)
        fin = np.isfinite(flat)
        scaled = flat * self.inv_ts
        np.minimum(scaled, CLIP, out=scaled)
        if self._padded:
            np.copyto(grid[:n, :P, :D], scaled.reshape(n, P, D), where=fin.reshape(n, P, D))
            mask.reshape(self.k, self.p_max, self.d_max)[:n, :P, :D] = fin.reshape(n, P, D)
        else:
            np.copyto(grid.reshape(self.k, pd)[:n], scaled, where=fin)
            mask[:n * pd] = fin.reshape(-1)
        return flat.min(axis=1).tolist()

    def empty(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Observation after the episode drained: no calls, instances idle, nothing valid."""
        glob = np.zeros(len(GLOBAL_FEATURES), dtype=np.float32)
        glob[GLOBAL_FEATURES.index("arrived")] = 1.0
        glob[GLOBAL_FEATURES.index("finished")] = 1.0
        obs = {
            "calls": np.zeros((self.k, len(CALL_FEATURES)), dtype=np.float32),
            "delta": np.full((self.k, self.p_max, self.d_max), DELTA_MASKED, dtype=np.float32),
            "prefill": self._prefill_static.copy(),
            "decode": self._decode_static.copy(),
            "globals": glob,
            "cached": self._cached_empty.copy(),
        }
        return obs, np.zeros(self.num_actions, dtype=bool)


def _begin_rows_python(calls: list[Call], decode_stage: bool, now: float, inv: float,
                       clip: float, log_tokens: float, table: np.ndarray, cached: np.ndarray,
                       clear: int, prefill: list[PrefillInstance], pre: np.ndarray,
                       decode: list[DecodeInstance], dec: np.ndarray, max_batch: list[float],
                       cols: tuple[int, int, int, int], glob: np.ndarray,
                       glob_values: tuple[float, ...],
                       ) -> tuple[list[float], list[float], int, int]:
    """The features fixed within a decision point, written in place: first the previous
    window's rows (``table[n:clear]``, ``cached[:clear]``) are cleared; then the calls' rows of
    ``table`` (CALL_FEATURES, clipped at ``clip``), their prefix-cache hit fractions in
    ``cached`` (prefill stage), the instances' queue, running, batch and waiting columns
    ``cols`` of ``pre`` and ``dec``, and ``glob`` = ``glob_values``. Returns each call's age,
    its horizon guarded above 0, the prefill instances running a prefill and the calls in
    decode batches (read on the way, for the step's info).

    The reference of the compiled ``kernels.begin_rows`` (same float64 operations in the same
    order, then float32)."""
    n = len(calls)
    table[n:clear] = 0.0
    cached[:clear] = 0.0
    glob[:] = glob_values
    age, h_est, rows = [], [], []
    for c in calls:
        wf = c.workflow
        a = now - wf.arrival
        h = wf.h_est
        age.append(a)
        h_est.append(h if h > 0.0 else 1e-9)  # the core's H_w(t) is > 0; guard the division
        entered = c.transfer_end if decode_stage else c.reveal_t
        rows.append((
            1.0, 0.0, a * inv, (now - entered) * inv, h * inv, a / h if h > 0.0 else 0.0,
            math.log1p(c.l_in) / log_tokens, math.log1p(c.l_out_pred) / log_tokens,
            c.est_duration * inv, math.log1p(wf.num_done), wf.service * inv,
            math.log1p(len(wf.open_calls)), clip, clip,
        ))
    if n:
        block = table[:n]
        block[:] = rows
        np.minimum(block, clip, out=block)
    if not decode_stage:
        P = len(prefill)
        for i, c in enumerate(calls):
            hits = c.cached
            if hits is not None:  # token counts: exact in float64, so the same quotients
                whole = max(c.l_in, 1)
                cached[i, :P] = [min(h / whole, 1.0) for h in hits]
    q, r, b, w = cols
    P, D = len(prefill), len(decode)
    pre[:P, q] = [math.log1p(len(inst.queue)) for inst in prefill]
    pre[:P, r] = [inst.running is not None for inst in prefill]
    dec[:D, b] = [len(inst.batch) / m for inst, m in zip(decode, max_batch, strict=True)]
    dec[:D, w] = [math.log1p(len(inst.waiting)) for inst in decode]
    return (age, h_est, sum(inst.running is not None for inst in prefill),
            sum(len(inst.batch) for inst in decode))
