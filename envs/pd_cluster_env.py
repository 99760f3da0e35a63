"""``hexagent_gym/PDCluster-v0``: one scheduling pick per step on a heterogeneous P-D cluster."""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from hexagent_gym.config import ConfigError, suggest
from hexagent_gym.envs.encoding import (
    CALL_FEATURES,
    CLIP,
    DECODE_FEATURES,
    GLOBAL_FEATURES,
    PREFILL_FEATURES,
    WORKFLOW_FEATURES,
    Encoder,
    MaskedDiscrete,
    workflow_rows,
)
from hexagent_gym.envs.render import render_ansi, step_info
from hexagent_gym.envs.rewards import Reward, make_reward
from hexagent_gym.envs.rollout import RolloutResult, rollout
from hexagent_gym.episode import EPISODE_KEYS, EXPERIMENT_META_KEYS, EpisodeFactory, load_config
from hexagent_gym.sim.metrics import attainment, req, slo_ratio

if TYPE_CHECKING:
    from hexagent_gym.planning.decisions import DecisionPoint
    from hexagent_gym.sim.simulator import Simulator

DEFAULT_K = 16
"""Call slots per decision point when the config leaves ``max_calls_per_decision`` unset."""


@dataclass(frozen=True)
class EnvOptions:
    """Env settings on top of :class:`~hexagent_gym.episode.EpisodeConfig` (same config mapping).

    Attributes:
        reward: registered reward name (``hexagent_gym.envs.rewards``: tail, attainment,
            mean_ratio) or an object implementing :class:`~hexagent_gym.envs.rewards.Reward`.
        reward_kwargs: extra keyword arguments of the reward, e.g. ``{"terminal_weight": 2.0}``.
        target_alpha: target SLO scale α of the rewards and of the ``attainment`` episode stat.
        p_max: prefill instance slots of the action and observation (None: the cluster's count).
            Larger values let one policy serve several clusters; smaller is a config error.
        d_max: decode instance slots (None: the cluster's count).
        max_steps: steps after which an episode is truncated (None: never).
        time_scale: seconds per unit of every time feature of the observation.
        action_mask_in_obs: add ``obs["action_mask"]`` (``MultiBinary``, the same truth values as
            :meth:`PDClusterEnv.action_masks`) for frameworks that read the mask from the
            observation (RLlib, torchrl); off by default (SB3 reads the method).
        workflow_obs: add ``obs["workflow"]`` (K, ``WORKFLOW_FEATURES``): each call's workflow
            as a front end knows it (forecast horizon, application id, first prompt, progress;
            docs/horizons.md); off by default, so models trained without it keep their space.
    """

    reward: str | Reward = "tail"
    reward_kwargs: Mapping[str, Any] = field(default_factory=dict)
    target_alpha: float = 1.5
    p_max: int | None = None
    d_max: int | None = None
    max_steps: int | None = None
    time_scale: float = 10.0
    action_mask_in_obs: bool = False
    workflow_obs: bool = False

    def __post_init__(self) -> None:
        src = "env config"
        if not isinstance(self.reward, str) and not isinstance(self.reward, Reward):
            raise ConfigError(f"{src}: reward must be a registered name or a Reward object, got "
                              f"{self.reward!r}")
        if not isinstance(self.reward_kwargs, Mapping):
            raise ConfigError(f"{src}: reward_kwargs must be a mapping, got "
                              f"{self.reward_kwargs!r}")
        for name in ("target_alpha", "time_scale"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
                raise ConfigError(f"{src}: {name} must be a number > 0, got {v!r}")
        for name in ("action_mask_in_obs", "workflow_obs"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{src}: {name} must be true or false, got "
                                  f"{getattr(self, name)!r}")
        for name in ("p_max", "d_max", "max_steps"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"{src}: {name} must be an integer >= 1 or null, got {v!r}")


ENV_KEYS = tuple(f.name for f in dataclasses.fields(EnvOptions))
CONFIG_KEYS = EPISODE_KEYS + ENV_KEYS
"""Every key PDClusterEnv accepts in its config mapping / YAML / keyword overrides."""


def _env_options(extra: dict[str, Any], source: str) -> EnvOptions:
    unknown = [k for k in extra if k not in ENV_KEYS]
    if unknown:
        key = unknown[0]
        hint = suggest(key, list(CONFIG_KEYS))
        raise ConfigError(f"{source}: unknown key '{key}' for PDClusterEnv.{hint} Valid keys: "
                          f"{', '.join(CONFIG_KEYS)}")
    try:
        return EnvOptions(**extra)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


class PDClusterEnv(gym.Env[dict[str, np.ndarray], np.int64]):
    """Schedule agentic LLM workflows on a heterogeneous prefill-decode disaggregated cluster.

    ## Description

    A discrete-event simulator serves a stream of agentic workflows (DAGs of LLM calls revealed
    online) on a cluster of prefill and decode instances of different GPU types. Whenever calls
    wait to be scheduled the simulator opens a *decision point* (docs/simulator.md): at the
    prefill stage the waiting calls need a (prefill, decode) pair and a queue rank; at the decode
    stage transferred calls, locked to their decode instance, need a rank. The agent picks the calls
    one at a time; the pick order is the rank. The window holds the ``K`` oldest waiting calls of
    the stage (the core's rule, identical with and without the env); calls beyond it wait FIFO.
    After each pick the planner's simulated state Ŝ and the projections Δ of the calls still
    unpicked are updated, exactly as HexAgent's Algorithm 1 sees them. The goal is tail SLO
    attainment: every workflow should finish within a small multiple α of its standalone
    completion time H_w.

    ## Action Space

    ``Discrete(K · P_max · D_max)``; action ``a`` is the pick (call slot, prefill instance, decode
    instance) with ``a = (slot · P_max + p) · D_max + d`` (decode with :meth:`decode_action`,
    encode with :meth:`encode_action`). :meth:`action_masks` is the joint validity mask (bool,
    length ``K · P_max · D_max``): empty or already-picked slots, padded instances (p ≥ P,
    d ≥ D), pairs whose decode instance can never hold the call's KV, and at the decode stage
    every pair but the call's locked one are invalid. ``step`` raises ``ValueError`` for an
    invalid action (never a silent fix-up). ``action_space.sample()`` draws uniformly from the
    currently valid actions.

    ## Observation Space

    A ``Dict`` of float32 ``Box``es; every value is clipped into its box. Times are seconds divided
    by ``time_scale`` (default 10 s) and clipped to [0, 100]; token counts are
    ``log1p(tokens) / 10``; counts are ``log1p(count)`` unless noted. Only scheduler-visible
    information is used: predicted output lengths, estimated durations and the scheduler's running
    horizon H_w(t), never true output lengths or the true H_w.

    - ``calls`` (K, 14), one row per call slot (oldest waiting call first), range [0, 100]:
      ``present`` (1 if the slot holds a call), ``picked`` (1 once picked at this decision point),
      ``age`` (now − workflow arrival), ``wait`` (now − entry into the current queue: reveal at the
      prefill stage, KV arrival at the decode stage), ``h_est`` (H_w(t)), ``age_over_h_est``
      (unitless), ``l_in`` and ``l_out_pred`` (tokens), ``est_duration`` (the call alone at its best
      pair), ``wf_done`` (finished calls of the workflow), ``wf_service`` (attained service along
      the workflow's critical path), ``wf_open`` (revealed unfinished calls of the workflow),
      ``min_delta`` (min Δ over the valid pairs), ``risk`` (HexAgent's ``(age + min Δ) / H_w(t)``,
      unitless). ``min_delta`` and ``risk`` are 100 once the slot is picked; empty slots are all 0.
    - ``delta`` (K, P_max, D_max), range [-1, 100]: projected completion Δ(c, p, d) in time units
      from now under the current Ŝ (prefill start + prefill + KV transfer + earliest feasible decode
      start + decode); −1 where the action is invalid.
    - ``prefill`` (P_max, 12), range [0, 100]: ``present``, ``free_in`` (Ŝ's projected free time
      − now; includes this decision point's picks), ``queue_len`` (log1p of queued calls),
      ``running`` (1 if busy), ``rel_time`` (prefill time of a 2048-token prompt relative to the
      cluster's fastest prefill instance, ≥ 1), GPU one-hot ``gpu_a100 … gpu_l40s, gpu_other``.
    - ``decode`` (D_max, 15), range [0, 100]: ``present``, ``committed_kv`` (Ŝ's predicted KV
      reservations / capacity: running, inbound and this decision point's picks),
      ``committed_count`` (Ŝ's reserved calls / max batch), ``batch`` (running calls / max batch),
      ``waiting`` (log1p of transferred calls waiting to be admitted), ``capacity`` (KV tokens,
      log1p / 10), ``max_batch`` (log1p / 10), ``rel_time`` (decode step time at batch 1 and 2048
      tokens of context relative to the cluster's fastest decode instance, ≥ 1), GPU one-hot as
      for prefill.
      (KV held by running calls is left out: the runtime reserves their *true* output length.)
    - ``globals`` (9,), range [0, 100]: ``stage`` (0 prefill, 1 decode), ``now`` (simulated
      time), ``window`` (calls in the window / K), ``unpicked`` (unpicked calls / K),
      ``beyond_window`` (log1p of calls of this stage waiting outside the window), ``arrived`` and
      ``finished`` (workflows / N), ``in_system`` (log1p of arrived unfinished workflows),
      ``picks`` (picks made at this decision point / K).
    - ``cached`` (K, P_max), range [0, 1] (box bound 100 like the rest): the fraction of each
      call's prompt found in each prefill instance's prefix cache at this decision point
      (cached tokens / L_in, as ``dp.cached / l_in``); a call's prefill there computes only the
      rest. 0 at the decode stage, with the prefix cache off, and for empty slots and padded
      instances. Fixed while the decision point is being picked.

    Feature names in order: ``hexagent_gym.envs.encoding.CALL_FEATURES``, ``PREFILL_FEATURES``,
    ``DECODE_FEATURES``, ``GLOBAL_FEATURES``.

    ## Rewards

    Pluggable by name (``reward``, see ``hexagent_gym.envs.rewards``). Workflows only complete
    while the simulator advances, i.e. on the step that makes the last pick of a decision point;
    other steps earn 0. With ratio ``r = C_w / H_w`` (C_w = completion − arrival, H_w = true
    standalone time):

    - ``tail`` (default): ``−max(0, r − α)`` per completed workflow, plus
      ``−terminal_weight · (Req99 − 1)`` when the episode drains (``terminal_weight`` = 1).
    - ``attainment``: ``+1/N`` per workflow with ``r ≤ α``; the return is the attainment at α.
    - ``mean_ratio``: ``−(r − 1)`` per completed workflow.

    α is ``target_alpha`` (default 1.5). No terminal term is paid on truncation.

    ## Starting State

    ``reset(seed=s)`` samples the episode (workflows, Poisson arrivals, estimation errors) with
    episode seed ``s`` itself: it is the episode ``EpisodeFactory.simulator(s)``, ``evaluate``'s
    cell with seed ``s`` and the console command's ``--seeds s`` run (one seed, one episode). The
    first ``reset()`` without a seed uses the config's ``seed``; later unseeded resets draw the
    next episode seed from ``self.np_random``. The simulator then runs to the first decision point
    (the first workflow's arrival).

    ## Episode End

    ``terminated`` when every workflow has finished (the trace drained); the observation is then
    empty and no action is valid. ``truncated`` after ``max_steps`` steps (if set). The info of
    the final step carries episode statistics: ``req95``, ``req99``, ``attainment`` (at α),
    ``mean_ratio``, ``num_workflows``, ``num_finished``, ``sim_seconds`` (on truncation over the
    workflows finished so far), ``episode_return`` and ``episode_seed``. Every step's and reset's
    info carries the keys of ``hexagent_gym.envs.render.STEP_INFO_KEYS``: the scalars
    ``sim_time``, ``waiting_prefill``, ``waiting_decode``, ``running_prefill``,
    ``running_decode``, ``workflows_arrived`` and ``workflows_finished``, and ``action_mask``
    (Gymnasium's convention, as Taxi-v3: a fresh bool array per reset/step, equal to
    :meth:`action_masks` right after it; all False on the step that drains the episode);
    ``reset`` adds ``episode_seed``.

    ## Rendering

    ``render_mode="ansi"``: :meth:`render` returns one screen of text (clock, the window's calls
    with their best Δ and risk, every instance's queue, Ŝ free time, batch and KV).

    ## Arguments

    ``PDClusterEnv(config=None, **overrides)`` and ``gymnasium.make("hexagent_gym/PDCluster-v0",
    config=None, **overrides)``: ``config`` is an experiment YAML path, a shipped experiment name, a
    mapping or None; overrides take precedence. Episode keys (``hexagent_gym.episode``):
    ``cluster``, ``trace``, ``num_workflows``, ``arrival_rate``, ``load``, ``seed``,
    ``estimation_error``, ``planning_latency``, ``max_calls_per_decision`` (K, default 16 here).
    Env keys (:class:`EnvOptions`): ``reward``, ``reward_kwargs``, ``target_alpha``, ``p_max``,
    ``d_max``, ``max_steps``, ``time_scale``, ``action_mask_in_obs`` (adds
    ``obs["action_mask"]``, ``MultiBinary(K · P_max · D_max)``). Unknown keys raise
    ``ConfigError``; the evaluation keys of an experiment file (``name``, ``description``,
    ``grid``, ``report``) are ignored.

    ## Version History

    - v0: initial version. Later additions kept v0 (defaults unchanged): the ``cached`` key,
      ``action_mask_in_obs``, per-step info and the ``ansi`` render, ``info["action_mask"]`` and
      the outermost ``ActionMasks`` wrapper of ``gymnasium.make`` (``hexagent_gym.envs.masks``).
    """

    # render_fps only paces tools that play frames back (e.g. a text recorder); ansi ignores it
    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, config: str | Path | Mapping[str, Any] | None = None, *,
                 render_mode: str | None = None, **overrides: Any) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError(f"PDClusterEnv: unknown render_mode={render_mode!r}; valid: "
                              f"{', '.join(self.metadata['render_modes'])} or None")
        episode, extra, source = load_config(config, **overrides)
        # an evaluation experiment (configs/experiments) works as a config too: its grid and
        # report describe the evaluation, only its top-level episode keys set the episode
        for key in EXPERIMENT_META_KEYS:
            if key not in overrides:
                extra.pop(key, None)
        self.options = _env_options(extra, source)
        k = episode.max_calls_per_decision or DEFAULT_K
        self.config = episode.replace(max_calls_per_decision=k)
        self.source = source
        self.factory = EpisodeFactory(self.config)
        cluster = self.factory.cluster
        P, D = len(cluster.prefill), len(cluster.decode)
        p_max = self.options.p_max or P
        d_max = self.options.d_max or D
        if p_max < P or d_max < D:
            raise ConfigError(f"{source}: cluster '{cluster.name}' has {P} prefill and {D} decode "
                              f"instances but p_max={p_max}, d_max={d_max}; raise p_max/d_max to "
                              f"at least ({P}, {D}) or leave them unset")
        self.k, self.p_max, self.d_max = k, p_max, d_max
        opts = self.options
        if isinstance(opts.reward, str):
            self.reward_fn: Reward = make_reward(opts.reward, opts.target_alpha,
                                                 **dict(opts.reward_kwargs))
        else:
            self.reward_fn = opts.reward
        self.encoder = Encoder(cluster, self.factory.tables, k, p_max, d_max, opts.time_scale)
        self._mask_in_obs = opts.action_mask_in_obs
        self._workflow_obs = opts.workflow_obs
        self._workflow = np.zeros((k, len(WORKFLOW_FEATURES)), dtype=np.float32)
        extra_spaces: dict[str, spaces.Space] = {}
        if self._mask_in_obs:
            extra_spaces["action_mask"] = spaces.MultiBinary(self.encoder.num_actions)
        if self._workflow_obs:
            extra_spaces["workflow"] = spaces.Box(0.0, CLIP, self._workflow.shape,
                                                  dtype=np.float32)
        self.observation_space = (spaces.Dict({**self.encoder.observation_space.spaces,
                                               **extra_spaces})
                                  if extra_spaces else self.encoder.observation_space)
        self.action_space = MaskedDiscrete(self.encoder.num_actions, self.action_masks)
        self.render_mode = render_mode
        self.default_seed = self.config.seed
        self._sim: Simulator | None = None
        self._dp: DecisionPoint | None = None
        self._mask = np.zeros(self.encoder.num_actions, dtype=bool)
        self._num_workflows = 0
        self._n_finished = 0
        self._steps = 0
        self._return = 0.0
        self._episode_seed: int | None = None
        self._step_cap = opts.max_steps
        self._info: dict[str, Any] = {}  # per-step info, refreshed when the simulator advances

    # -- Gymnasium API ----------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[dict[str, np.ndarray], dict]:
        """Start a new episode (``options`` is accepted and unused)."""
        if seed is None and self._np_random is None:
            seed = self.default_seed
        super().reset(seed=seed)
        # the reset seed *is* the episode seed, so every entry point runs the same episode for
        # it; only unseeded resets after the first continue the env's own stream
        episode_seed = int(seed) if seed is not None else int(self.np_random.integers(2**31))
        obs = self._start(episode_seed)
        # a copy: the caller may keep or edit the info's mask; the env's own must not change
        return obs, {**self._info, "action_mask": self._mask.copy(), "episode_seed": episode_seed}

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict]:
        dp = self._dp
        if dp is None:
            raise RuntimeError("no decision point is open: call reset() first (the episode "
                               "has ended or never started)")
        self._pick(action, dp)
        self._steps += 1
        reward = 0.0
        terminated = False
        if not dp.done:  # more picks at this decision point: only the observation changes
            obs, mask = self.encoder.observe()
        else:
            sim = self._sim
            nxt = sim.run_until_decision()
            finished = sim.finished
            if len(finished) > self._n_finished:
                ratios = [slo_ratio(w.arrival, w.finish_t, w.horizon)
                          for w in finished[self._n_finished:]]
                self._n_finished = len(finished)
                reward += self.reward_fn.completions(ratios)
            if nxt is None:
                self._info = step_info(sim)
                terminated = True
                self._dp = None
                reward += self.reward_fn.terminal(sim.result().ratios)
                obs, mask = self.encoder.empty()
                self._workflow = np.zeros_like(self._workflow)
            else:
                self._dp = nxt
                self._info = step_info(sim, self.encoder.begin(sim, nxt, self._num_workflows))
                if self._workflow_obs:
                    self._workflow = workflow_rows(nxt.calls, self.k, nxt.now,
                                                   1.0 / self.options.time_scale)
                obs, mask = self.encoder.observe()
        obs = self._emit(obs, mask)
        reward = float(reward)
        self._return += reward
        truncated = (not terminated and self._step_cap is not None
                     and self._steps >= self._step_cap)
        info = dict(self._info)
        info["action_mask"] = self._mask.copy()
        if terminated or truncated:
            info.update(self._final_info())
        return obs, reward, terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        """Joint validity mask of the actions at the current step (bool, K·P_max·D_max)."""
        return self._mask.copy()

    def render(self) -> str | None:
        """``render_mode="ansi"``: a one-screen text picture of the cluster at the current step
        (the window's calls, every instance's queue, Ŝ and KV); None without a render mode."""
        if self.render_mode is None:
            return None
        return render_ansi(self._sim, self._dp, self._num_workflows, self._steps)

    # -- helpers --------------------------------------------------------------------------------
    @property
    def simulator(self) -> Simulator | None:
        """The current episode's simulator (read it; don't advance it behind the env's back)."""
        return self._sim

    @property
    def decision_point(self) -> DecisionPoint | None:
        """The open decision point (None before reset and after the episode ended)."""
        return self._dp

    @property
    def episode_seed(self) -> int | None:
        """Seed of the current episode's simulator (``EpisodeFactory.simulator(seed)``)."""
        return self._episode_seed

    def decode_action(self, action: int) -> tuple[int, int, int]:
        """Action index → (call slot, prefill instance, decode instance)."""
        return self.encoder.decode_action(operator.index(action))

    def encode_action(self, slot: int, p: int, d: int) -> int:
        """(call slot, prefill instance, decode instance) → action index (e.g. a heuristic pick)."""
        return self.encoder.encode_action(slot, p, d)

    def episode_seed_for(self, seed: int | None = None) -> int:
        """The episode seed that ``reset(seed=seed)`` on a fresh env uses: ``seed`` itself
        (None: the config's)."""
        return self.default_seed if seed is None else int(seed)

    def rollout(self, policy: Any, seed: int | None = None,
                deterministic: bool = True) -> RolloutResult:
        """Run one whole episode with ``policy`` and return its metrics.

        Args:
            policy: a registered policy name, a policy object with ``pick(dp)`` (both run on the
                bare simulator, built exactly as ``reset(seed=seed)`` builds it), or a model with
                ``predict(obs, ...)`` (SB3 / sb3-contrib; run through this env, with
                ``action_masks`` when ``predict`` accepts them), or the path of a saved
                MaskablePPO model (a ``Path`` or a string ending in ``.zip``, e.g. the ``--out``
                of ``scripts/train.py``), loaded and run like a model.
            seed: reset seed of the episode (None: the config's ``seed``).
            deterministic: passed to ``model.predict``.

        A model rollout resets this env and leaves it at the end of the episode; ``max_steps``
        does not truncate a rollout. With a policy name, the episode's simulator (built and
        used only here) is freed as soon as the result is built (``Engine.close``); a policy
        object's episode is not, since the policy may keep calls and read their workflows.
        """
        return rollout(self, policy, seed=seed, deterministic=deterministic)

    def _start(self, episode_seed: int) -> dict[str, np.ndarray]:
        sim = self.factory.simulator(episode_seed)
        self._sim = sim
        self._episode_seed = episode_seed
        self._num_workflows = len(sim.workload.workflows)
        self.reward_fn.reset(self._num_workflows)
        self._n_finished = 0
        self._steps = 0
        self._return = 0.0
        dp = sim.run_until_decision()
        assert dp is not None, "an episode with workflows opens at least one decision point"
        self._dp = dp
        self._info = step_info(sim, self.encoder.begin(sim, dp, self._num_workflows))
        if self._workflow_obs:
            self._workflow = workflow_rows(dp.calls, self.k, dp.now,
                                           1.0 / self.options.time_scale)
        return self._emit(*self.encoder.observe())

    def _emit(self, obs: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
        """Keep ``mask`` as the step's action mask; add it to ``obs`` when asked to."""
        self._mask = mask
        if self._mask_in_obs:
            obs["action_mask"] = mask.astype(np.int8)
        if self._workflow_obs:  # fixed within a decision; a fresh array every step
            obs["workflow"] = self._workflow.copy()
        return obs

    def _pick(self, action: Any, dp: DecisionPoint) -> tuple[int, int, int]:
        """Decode, validate and apply an action; raises ValueError saying why it is invalid."""
        if isinstance(action, np.ndarray) and action.size == 1:
            action = action.reshape(()).item()
        try:
            a = operator.index(action)
        except TypeError:
            raise ValueError(f"action must be an integer index in [0, {self.encoder.num_actions})"
                             f", got {action!r}") from None
        enc = self.encoder
        if not 0 <= a < enc.num_actions:
            raise ValueError(f"action {a} is out of range [0, {enc.num_actions}) "
                             f"(K={self.k}, P_max={self.p_max}, D_max={self.d_max})")
        slot, p, d = enc.decode_action(a)
        n = len(dp.calls)
        problem = None
        if slot >= n:
            problem = (f"call slot {slot} is empty; this decision point has {n} call(s) "
                       f"(slots 0..{n - 1})")
        elif p >= enc.num_prefill:
            problem = (f"prefill slot {p} is padding; the cluster has {enc.num_prefill} prefill "
                       f"instances (P_max={self.p_max})")
        elif d >= enc.num_decode:
            problem = (f"decode slot {d} is padding; the cluster has {enc.num_decode} decode "
                       f"instances (D_max={self.d_max})")
        else:
            try:
                dp.pick(slot, p, d)
            except ValueError as exc:
                problem = str(exc)
        if problem is not None:
            raise ValueError(f"action {a} = (slot {slot}, prefill {p}, decode {d}): {problem}")
        return slot, p, d

    def _final_info(self) -> dict[str, Any]:
        sim = self._sim
        ratios = np.array([slo_ratio(w.arrival, w.finish_t, w.horizon) for w in sim.finished])
        return {
            "req95": req(ratios, 0.95),
            "req99": req(ratios, 0.99),
            "attainment": attainment(ratios, self.options.target_alpha),
            "mean_ratio": float(ratios.mean()) if len(ratios) else float("nan"),
            "num_workflows": self._num_workflows,
            "num_finished": len(ratios),
            "sim_seconds": float(sim.now),
            "episode_return": self._return,
            "episode_seed": self._episode_seed,
        }


def _build_env(config: Any, rank: int, overrides: dict[str, Any]) -> PDClusterEnv:
    env = PDClusterEnv(config, **overrides)
    env.default_seed += rank
    return env


def make_env_fn(config: str | Path | Mapping[str, Any] | None = None, *, rank: int = 0,
                **overrides: Any) -> Callable[[], PDClusterEnv]:
    """A picklable thunk building a :class:`PDClusterEnv` (for DummyVecEnv / SubprocVecEnv /
    gymnasium vector envs).

    ``rank`` offsets the config seed used by the first unseeded ``reset()``, so sub-envs of an
    unseeded vector env sample different episodes; seeded resets ignore it.
    """
    return functools.partial(_build_env, config, rank, dict(overrides))


__all__ = ["CALL_FEATURES", "CONFIG_KEYS", "DECODE_FEATURES", "DEFAULT_K", "GLOBAL_FEATURES",
           "PREFILL_FEATURES", "EnvOptions", "PDClusterEnv", "make_env_fn"]
