"""Run one whole episode with a policy (name, policy object or SB3 model) and collect metrics.

Heuristics (registered names and objects with ``pick(dp)``) run on the bare simulator via
:func:`hexagent_gym.policy.run_policy`, built exactly as ``env.reset(seed=seed)`` builds it (same
episode seed, same window K): no observation encoding, so they run at core speed, and a test
checks that stepping the env with the same picks gives identical ratios. Models (objects with
``predict``) need observations, so they run through the env.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hexagent_gym.policy import load_saved, make_policy, run_policy
from hexagent_gym.sim.metrics import EpisodeResult


@dataclass
class RolloutResult:
    """Metrics of one episode run by :func:`rollout`.

    Attributes:
        episode: the simulator's :class:`~hexagent_gym.sim.metrics.EpisodeResult` (ratios, records,
            counts, timings); its attributes are readable on the result directly.
        seed: the reset seed (None resolved to the config's seed).
        episode_seed: the simulator seed derived from it (``EpisodeFactory.simulator(seed)``).
        total_reward: return under the env's reward. For heuristics it is computed from the final
            ratios (exact for rewards that add up per workflow, as every built-in one does).
        steps: env steps (= picks) taken.
    """

    episode: EpisodeResult
    seed: int
    episode_seed: int
    total_reward: float
    steps: int

    def __getattr__(self, name: str) -> Any:
        # Every metric (policy, ratios, req95, req99, req(τ), attainment(α), num_workflows,
        # num_calls, invocations, decisions, scheduler_seconds, sim_seconds, wall_seconds, ...)
        # is the episode's; one delegation instead of a forwarding property per field.
        if name == "episode":  # not set yet (e.g. during unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.episode, name)

    def save_timeline(self, path: str | Path, workflow: int | str | None = None,
                      window: tuple[float, float] | None = None) -> tuple[Path, Path]:
        """Write the episode's timeline: the Chrome/Perfetto trace JSON to ``path`` and the Gantt
        PNG next to it (``path`` with the suffix ``.png``); docs/timelines.md.

        Args:
            path: the trace JSON to write (parents created); its PNG gets the same stem.
            workflow, window: the Gantt's highlighted workflow and time window
                (:meth:`~hexagent_gym.sim.timeline.Timeline.save_gantt`; None: the worst workflow's
                lifetime).

        Returns:
            (trace JSON path, PNG path).

        Raises:
            ValueError: the episode ran without ``record_timeline=True``, or ``path`` ends in
                ``.png`` (it names the JSON), or a bad ``workflow``/``window``.
        """
        timeline = self.episode.timeline
        if timeline is None:
            raise ValueError("this episode was run without a timeline: build the env with "
                             "record_timeline=True (hexagent_gym.make(..., "
                             "record_timeline=True), or `record_timeline: true` in its "
                             "experiment YAML) and roll out again")
        path = Path(path)
        if path.suffix.lower() == ".png":
            raise ValueError(f"{path} names the trace JSON, and its Gantt PNG goes next to it "
                             "with the suffix .png; give a .json path")
        png = path.with_suffix(".png")
        timeline.save_chrome_trace(path)
        timeline.save_gantt(png, workflow=workflow, window=window)
        return path, png

    def to_dict(self, include_records: bool = False) -> dict[str, Any]:
        """JSON-ready summary (the EpisodeResult's, plus seeds, return and steps)."""
        out = self.episode.to_dict(include_records=include_records)
        out.update(seed=self.seed, episode_seed=self.episode_seed,
                   total_reward=self.total_reward, steps=self.steps)
        return out


def rollout(env: Any, policy: Any, seed: int | None = None,
            deterministic: bool = True) -> RolloutResult:
    """Run one episode of ``env``'s configuration with ``policy``; see :meth:`PDClusterEnv.rollout`.

    Raises:
        TypeError: ``policy`` is neither a name, nor has ``pick`` or ``predict``.
        ValueError: unknown policy name, a file that is no MaskablePPO model, or a model
            without masks chose an invalid action.
        FileNotFoundError: a model path (``Path`` or ``*.zip``) that does not exist.
    """
    env = env.unwrapped
    seed = env.default_seed if seed is None else int(seed)
    if isinstance(policy, str | Path) and _is_model_path(policy):
        policy = load_saved(policy)
    elif isinstance(policy, str):
        # built here and handed to nobody: its episode can be freed at once (Engine.close)
        return _run_heuristic(env, make_policy(policy), seed, close=True)
    if hasattr(policy, "pick"):
        return _run_heuristic(env, policy, seed)
    if hasattr(policy, "predict"):
        return _run_model(env, policy, seed, deterministic)
    raise TypeError(f"cannot roll out {type(policy).__name__}: expected a registered policy name, "
                    "an object with pick(dp) or a model with predict(obs)")


def _is_model_path(policy: str | Path) -> bool:
    """A saved SB3 model: a Path, or a string naming a ``.zip`` (policy names never contain one)."""
    return isinstance(policy, Path) or policy.endswith(".zip")


def _run_heuristic(env: Any, policy: Any, seed: int, close: bool = False) -> RolloutResult:
    """A policy object's episode on the bare simulator; ``close`` frees it at once (only for a
    policy built here: a user's policy may keep calls, whose workflows close would unlink)."""
    episode_seed = env.episode_seed_for(seed)
    sim = env.factory.simulator(episode_seed)
    result = run_policy(sim, policy, close=close)
    reward = env.reward_fn
    reward.reset(result.num_workflows)
    ratios = result.ratios
    total = reward.completions([float(r) for r in ratios]) + reward.terminal(ratios)
    return RolloutResult(result, seed, episode_seed, float(total), result.decisions)


def _run_model(env: Any, model: Any, seed: int, deterministic: bool) -> RolloutResult:
    try:
        maskable = "action_masks" in inspect.signature(model.predict).parameters
    except (TypeError, ValueError):
        maskable = False
    name = getattr(model, "name", None) or type(model).__name__
    cap = env._step_cap
    env._step_cap = None  # a rollout runs the whole episode
    try:
        obs, info = env.reset(seed=seed)
        total = 0.0
        steps = 0
        while True:
            mask = env.action_masks()
            if maskable:
                action, _ = model.predict(obs, action_masks=mask, deterministic=deterministic)
            else:
                action, _ = model.predict(obs, deterministic=deterministic)
            a = int(np.asarray(action).reshape(-1)[0])
            if not (0 <= a < len(mask) and mask[a]):
                slot, p, d = env.decode_action(a) if 0 <= a < len(mask) else (-1, -1, -1)
                why = (" despite the action mask" if maskable else
                       "; its predict() takes no action_masks, so it cannot avoid invalid "
                       "actions: train it with sb3_contrib MaskablePPO or wrap it to mask")
                raise ValueError(f"{name} chose invalid action {a} (slot {slot}, prefill {p}, "
                                 f"decode {d}) at step {steps}{why}")
            obs, reward, terminated, truncated, info = env.step(a)
            total += reward
            steps += 1
            if terminated:
                break
    finally:
        env._step_cap = cap
    result = env.simulator.result(name)
    return RolloutResult(result, seed, info["episode_seed"], total, steps)
