"""How many objects an episode leaves for Python's cyclic garbage collector, per simulated call.

Every container that lives to an episode's end (a call, its workflow, a tuple or list it holds)
brings the collector's next collection nearer, and collections cost env.step about a tenth of
its time on this project's machine (docs/performance.md). Queue keys are ints and the
projections' per-call constants float slots for this reason; these budgets fail if a tuple per
call comes back (the code before kept 4.6 and 4.7 per call in the two cases below)."""

from __future__ import annotations

import gc
from collections.abc import Callable

import numpy as np

from hexagent_gym.agents import make_policy
from hexagent_gym.envs.pd_cluster_env import PDClusterEnv
from hexagent_gym.episode import EpisodeConfig, EpisodeFactory

BUDGET = 3.0  # tracked objects alive at an episode's end, per simulated call


def tracked_per_call(run: Callable[[], int]) -> float:
    """Objects the collector tracks after ``run`` (returning its simulated calls) minus
    before, per call, with the collector off meanwhile (so nothing is untracked or freed by
    it: what a collection would find)."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        before = len(gc.get_objects())
        calls = run()
        return (len(gc.get_objects()) - before) / calls
    finally:
        if was:
            gc.enable()


def test_env_episode_with_random_valid_actions():
    env = PDClusterEnv(cluster="hetero-1", trace="bfcl_v3", num_workflows=200, seed=0)

    def episode() -> int:
        env.reset(seed=0)
        rng = np.random.default_rng(0)
        while not env.step(int(rng.choice(np.flatnonzero(env.action_masks()))))[2]:
            pass
        return env.simulator.num_calls

    episode()  # the first episode also fills the env's caches (prefill times, horizons)
    assert tracked_per_call(episode) < BUDGET


def test_hexagent_episode_with_estimation_errors_and_sample_groups():
    factory = EpisodeFactory(EpisodeConfig(cluster="hetero-1", trace="lats", num_workflows=60,
                                           load=1.0, seed=1, estimation_error=0.2))

    def episode() -> int:
        sim = factory.simulator(7)  # the same episode twice: the second finds every cache warm
        policy = make_policy("hexagent")
        policy.reset(sim)
        sim.run(policy.pick, pause_gc=False)
        return sim.num_calls

    episode()
    assert tracked_per_call(episode) < BUDGET
