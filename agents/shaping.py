"""Training-time reward relative to a reference heuristic on the same episode.

PPO's return of one scheduling episode is dominated by how hard the sampled episode was (its
arrivals and workflow mix), not by the policy: a −3 return can be excellent on one seed and
poor on another, and the critic cannot tell the seeds apart. Because episodes are seeded and the
simulator is deterministic, the reference heuristic (HexAgent) can be run on the *same* episode
for a fraction of the cost of the learner's episode (bare simulator, no encoding), and the reward
becomes the learner's advantage over it, per workflow:

    r_step = − Σ_{w completed in the step} [g(C_w/H_w) − g(ref ratio of w)],  g(r) = max(0, r − α)

plus at the end of a drained episode ``−terminal_weight · (Req99 − Req99_ref)``. The return is
then 0 for a policy that matches the reference, positive when it beats it, and its variance
across seeds is mostly gone (the greedy-rollout baseline of Kool et al., 2019, applied per
workflow). Workflows are matched by arrival order (``Workflow.uid``), which both runs share.

Used by ``scripts/train.py --relative-to hexagent``; evaluation always reports the env's own
metrics.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from hexagent_gym.policy import make_policy, run_policy
from hexagent_gym.sim.metrics import req, slo_ratio


class ReferenceRelativeReward(gym.Wrapper):
    """Replace a PDClusterEnv's reward by the advantage over a reference policy (see module).

    Args:
        env: a PDClusterEnv (or a wrapper of one).
        reference: registered policy name run on the same episode.
        alpha: α of g (None: the env's ``target_alpha``).
        terminal_weight: weight of the Req99 difference paid when the episode drains.
        cache_size: reference results kept by episode (evaluation re-uses seeds).

    The step info of the final step gains ``reference_req99`` and ``relative_return``.
    """

    def __init__(self, env: gym.Env, reference: str = "hexagent", alpha: float | None = None,
                 terminal_weight: float = 1.0, cache_size: int = 64) -> None:
        super().__init__(env)
        self.reference = reference
        self.alpha = float(env.unwrapped.options.target_alpha if alpha is None else alpha)
        self.terminal_weight = float(terminal_weight)
        self._cache: OrderedDict[tuple, tuple[np.ndarray, float]] = OrderedDict()
        self._cache_size = cache_size
        self._ref = np.zeros(0)
        self._ref_req99 = 0.0
        self._done = 0
        self._return = 0.0

    def _reference(self, episode_seed: int) -> tuple[np.ndarray, float]:
        base = self.env.unwrapped
        # keyed by the episode's config too: a MixtureEnv serves several settings
        key = (base.config, episode_seed)
        hit = self._cache.get(key)
        if hit is None:
            result = run_policy(base.factory.simulator(episode_seed),
                                make_policy(self.reference), close=True)
            hit = (np.asarray(result.ratios, dtype=float), float(result.req99))
            self._cache[key] = hit
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return hit

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        obs, info = self.env.reset(**kwargs)
        self._ref, self._ref_req99 = self._reference(int(info["episode_seed"]))
        self._done = 0
        self._return = 0.0
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, _, terminated, truncated, info = self.env.step(action)
        sim = self.env.unwrapped.simulator
        finished = sim.finished
        reward = 0.0
        if len(finished) > self._done:
            a, ref = self.alpha, self._ref
            for w in finished[self._done:]:
                r = slo_ratio(w.arrival, w.finish_t, w.horizon)
                reward -= max(0.0, r - a) - max(0.0, float(ref[w.uid]) - a)
            self._done = len(finished)
        if terminated:
            ratios = sim.result().ratios
            reward -= self.terminal_weight * (req(ratios, 0.99) - self._ref_req99)
        reward = float(reward)
        self._return += reward
        if terminated or truncated:
            info = dict(info, reference_req99=self._ref_req99, relative_return=self._return)
        return obs, reward, terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        return self.env.unwrapped.action_masks()


def _build(env_fn: Callable[[], gym.Env], kwargs: dict[str, Any]) -> gym.Env:
    return ReferenceRelativeReward(env_fn(), **kwargs)


def relative_env_fn(env_fn: Callable[[], gym.Env], **kwargs: Any) -> Callable[[], gym.Env]:
    """A picklable thunk wrapping ``env_fn()`` (e.g. ``hexagent_gym.envs.make_env_fn(...)``) in
    :class:`ReferenceRelativeReward` (for DummyVecEnv / SubprocVecEnv)."""
    import functools

    return functools.partial(_build, env_fn, dict(kwargs))


__all__ = ["ReferenceRelativeReward", "relative_env_fn"]
