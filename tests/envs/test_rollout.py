"""env.rollout: heuristics on the bare simulator equal the same picks made through env.step;
results are deterministic per seed; models run through the env."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

import hexagent_gym
from hexagent_gym.envs.rollout import RolloutResult
from hexagent_gym.planning.decisions import earliest_finish_pick
from hexagent_gym.policy import make_policy

TINY = dict(cluster="tiny-2p2d", trace="bfcl_v3", num_workflows=8, seed=3)
SMALL = dict(cluster="hetero-1", trace="bfcl_v3", num_workflows=40, seed=0)
NOISY = dict(cluster="hetero-1", trace="lats", num_workflows=6, seed=1, estimation_error=0.3,
             max_calls_per_decision=4, load=1.5)
LATE = dict(cluster="tiny-2p2d", trace="bfcl_v3", num_workflows=12, seed=2,
            planning_latency=0.002, load=1.5)


class FallbackPicker:
    """The core's fallback as a minimal Policy (no agents import)."""

    name = "fallback-picker"

    def reset(self, sim) -> None:
        pass

    def pick(self, dp):
        return earliest_finish_pick(dp)


# Policies whose bare-simulator rollout must equal stepping the env with their picks.
# Adding a registered policy is one line.
POLICIES = {
    "fallback-picker": FallbackPicker,
    "fallback": lambda: make_policy("fallback"),
    "hexagent": lambda: make_policy("hexagent"),
    "wf-fcfs": lambda: make_policy("wf-fcfs"),
}


def untimed(d: dict) -> dict:
    """A result dict without its wall-clock fields."""
    return {k: v for k, v in d.items() if "seconds" not in k and "_ms" not in k}


def step_with_policy(env, policy, seed):
    """Drive env.step with a heuristic's picks; returns (ratios, return, steps)."""
    env = env.unwrapped
    env.reset(seed=seed)
    policy.reset(env.simulator)
    total, steps = 0.0, 0
    while True:
        slot, p, d = policy.pick(env.decision_point)
        _, reward, terminated, truncated, info = env.step(env.encode_action(slot, p, d))
        total += reward
        steps += 1
        assert not truncated
        if terminated:
            return env.simulator.result().ratios, total, steps, info


@pytest.mark.parametrize("name", list(POLICIES))
@pytest.mark.parametrize("config", [TINY, SMALL, NOISY, LATE],
                         ids=["tiny-2p2d", "hetero-1", "lats-error-k4", "async-plans"])
def test_bare_simulator_rollout_equals_env_steps(name, config):
    env = hexagent_gym.make(**config)
    via_rollout = env.rollout(POLICIES[name](), seed=11)
    ratios, total, steps, info = step_with_policy(env, POLICIES[name](), seed=11)
    np.testing.assert_array_equal(via_rollout.ratios, ratios)
    assert via_rollout.decisions == steps == via_rollout.steps
    assert via_rollout.episode_seed == info["episode_seed"]
    assert via_rollout.total_reward == pytest.approx(total, rel=1e-12, abs=1e-12)
    assert info["req99"] == via_rollout.req99


def test_rollout_is_deterministic_per_seed_and_seeds_differ():
    env = hexagent_gym.make(**TINY)
    a = env.rollout(FallbackPicker(), seed=5)
    b = env.rollout(FallbackPicker(), seed=5)
    c = env.rollout(FallbackPicker(), seed=6)
    np.testing.assert_array_equal(a.ratios, b.ratios)
    assert untimed(a.to_dict(include_records=True)) == untimed(b.to_dict(include_records=True))
    assert a.episode_seed != c.episode_seed
    assert not np.array_equal(a.ratios, c.ratios)
    # a fresh env with the same config reproduces it; seed=None is the config's seed
    fresh = hexagent_gym.make(**TINY)
    np.testing.assert_array_equal(fresh.rollout(FallbackPicker(), seed=5).ratios, a.ratios)
    np.testing.assert_array_equal(fresh.rollout(FallbackPicker()).ratios,
                                  env.rollout(FallbackPicker(), seed=TINY["seed"]).ratios)


def test_rollout_episode_is_the_one_reset_builds():
    env = hexagent_gym.make(**TINY)
    _, info = env.reset(seed=9)
    assert env.episode_seed_for(9) == info["episode_seed"] == env.episode_seed
    assert env.rollout(FallbackPicker(), seed=9).episode_seed == info["episode_seed"]


def test_rollout_result_fields():
    env = hexagent_gym.make(**TINY)
    r = env.rollout(FallbackPicker(), seed=1)
    assert isinstance(r, RolloutResult)
    assert r.policy == "fallback-picker"
    assert r.num_workflows == 8 == len(r.ratios)
    assert np.all(r.ratios >= 1.0 - 1e-9)
    assert r.num_calls >= r.num_workflows
    assert r.invocations >= 1 and r.decisions >= r.num_calls  # each call picked at both stages
    assert r.scheduler_seconds >= 0.0 and r.sim_seconds > 0.0
    srt = np.sort(r.ratios)
    assert r.req99 == srt[-1]  # ⌈0.99·8⌉ = 8th smallest
    assert r.req95 == srt[-1]
    assert r.attainment(srt[3]) == pytest.approx(4 / 8)
    assert r.attainment(1e9) == 1.0
    d = r.to_dict()
    json.dumps(d)
    for key in ("req95", "req99", "ratios", "num_workflows", "num_calls", "invocations",
                "decisions", "scheduler_seconds", "sim_seconds", "policy", "seed",
                "episode_seed", "total_reward", "steps"):
        assert key in d


def test_rollout_by_registered_name_and_on_gymnasium_make_unwrapped():
    env = gym.make("hexagent_gym/PDCluster-v0", **TINY)
    by_name = env.unwrapped.rollout("fallback", seed=2)
    by_object = hexagent_gym.make(**TINY).rollout(FallbackPicker(), seed=2)
    assert by_name.policy == "fallback"
    np.testing.assert_array_equal(by_name.ratios, by_object.ratios)
    with pytest.raises(ValueError, match="unknown policy"):
        env.unwrapped.rollout("no-such-policy")
    with pytest.raises(TypeError, match="cannot roll out"):
        env.unwrapped.rollout(object())


class MaskedModel:
    """Model stand-in with SB3's maskable predict signature: first valid action."""

    def predict(self, obs, state=None, episode_start=None, deterministic=False,
                action_masks=None):
        return np.array(int(np.flatnonzero(action_masks)[0])), None


class UnmaskedModel:
    """Model stand-in without masks that always answers action 0."""

    def predict(self, obs, state=None, episode_start=None, deterministic=False):
        return np.array(0), None


class FirstValidFallback:
    """Heuristic equal to MaskedModel: oldest unpicked slot at its lowest-index valid pair."""

    name = "first-valid"

    def reset(self, sim) -> None:
        pass

    def pick(self, dp):
        slot = dp.picked.index(False)
        p, d = np.argwhere(dp.feasible(slot))[0]
        return slot, int(p), int(d)


def test_model_rollout_uses_masks_and_matches_the_same_heuristic():
    env = hexagent_gym.make(**TINY, max_steps=3)
    model = env.rollout(MaskedModel(), seed=4)
    heuristic = env.rollout(FirstValidFallback(), seed=4)
    np.testing.assert_array_equal(model.ratios, heuristic.ratios)
    assert model.steps == heuristic.steps == model.decisions  # max_steps does not cut a rollout
    assert model.policy == "MaskedModel"
    assert model.total_reward == pytest.approx(heuristic.total_reward, rel=1e-12, abs=1e-12)


def test_model_without_masks_choosing_an_invalid_action_raises_clearly():
    env = hexagent_gym.make(**TINY)
    # action 0 = (slot 0, p 0, d 0) is valid until a decision point with several calls has
    # picked slot 0 (a later step of this episode): no silent fix-up, a clear error instead
    with pytest.raises(ValueError, match=r"UnmaskedModel chose invalid action 0 \(slot 0, "
                                         r"prefill 0, decode 0\) at step [1-9]\d*; .*MaskablePPO"):
        env.rollout(UnmaskedModel(), seed=0)


def test_unmasked_model_error_is_raised_at_the_first_invalid_step():
    class Always(UnmaskedModel):
        def predict(self, obs, state=None, episode_start=None, deterministic=False):
            return np.array(63), None  # slot 15: empty in the tiny episode's first decision

    env = hexagent_gym.make(**TINY)
    with pytest.raises(ValueError, match=r"Always chose invalid action 63 \(slot 15, prefill 1, "
                                         r"decode 1\) at step 0"):
        env.rollout(Always(), seed=0)


def test_scaling_bench_reports_the_rollouts_it_timed():
    from hexagent_gym.envs.benchmark import bench_scaling

    (row,) = bench_scaling("hexagent", "mixed", 1.0, rows=(("tiny-2p2d", 6),))
    ref = hexagent_gym.make(cluster="tiny-2p2d", trace="mixed", num_workflows=6, load=1.0).rollout(
        "hexagent")
    assert (row.cluster, row.instances, row.num_workflows) == ("tiny-2p2d", "2P+2D", 6)
    assert row.num_calls == ref.num_calls and row.req99 == ref.req99
    assert row.picks_per_call == ref.decisions / ref.num_calls > 0
    assert row.us_per_call_first > 0 and row.us_per_call > 0 and row.ms_per_invocation > 0
    assert row.laps == 1  # the only row is the longest
    assert 0.0 <= row.gc_us_per_call < row.us_per_call


def test_collector_clock_adds_up_collections_only():
    import gc

    from hexagent_gym.envs.benchmark import _CollectorClock

    clock = _CollectorClock()
    gc.callbacks.append(clock)
    try:
        assert clock.seconds == 0.0
        gc.collect()
        once = clock.seconds
        assert once > 0.0
        sum(range(100_000))  # no collection: nothing added
        assert clock.seconds == once
        gc.collect(0)
        assert clock.seconds > once
    finally:
        gc.callbacks.remove(clock)


def test_scaling_bench_times_every_row_over_about_as_many_calls():
    from hexagent_gym.envs.benchmark import bench_scaling

    short, long = bench_scaling("hexagent", "mixed", 1.0, repeat=1,
                                rows=(("tiny-2p2d", 3), ("tiny-2p2d", 12)))
    assert long.laps == 1 and long.num_calls > short.num_calls
    # the short episode runs back to back until it has simulated at least the long one's calls
    assert short.laps == -(-long.num_calls // short.num_calls) > 1
    assert (short.laps - 1) * short.num_calls < long.num_calls <= short.laps * short.num_calls


def test_scaling_bench_keeps_every_round_and_pairs_rows_round_by_round():
    from dataclasses import replace

    from hexagent_gym.envs.benchmark import bench_scaling, paired_ratios

    short, long = bench_scaling("hexagent", "mixed", 1.0, repeat=3,
                                rows=(("tiny-2p2d", 3), ("tiny-2p2d", 12)))
    assert len(short.samples) == len(long.samples) == 3
    assert min(short.samples) == short.us_per_call and min(long.samples) == long.us_per_call
    assert paired_ratios(long, short) == [a / b for a, b in zip(long.samples, short.samples,
                                                                         strict=True)]
    # by hand: a slow second round weighs on both rows of it, not on the paired ratio
    fast = replace(short, samples=(50.0, 80.0, 52.0))
    slow = replace(long, samples=(60.0, 96.0, 65.0))
    assert paired_ratios(slow, fast) == [1.2, 1.2, 1.25]
    with pytest.raises(ValueError, match="rows of one bench_scaling table, got 3 and 2"):
        paired_ratios(long, replace(short, samples=(1.0, 2.0)))
    with pytest.raises(ValueError, match="got 0 and 0"):
        paired_ratios(replace(long, samples=()), replace(short, samples=()))


class KeepingPicker(FallbackPicker):
    """A user's policy that keeps the calls it decided (to analyse them afterwards)."""

    name = "keeping-picker"

    def __init__(self) -> None:
        self.calls = []

    def pick(self, dp):
        self.calls.extend(dp.calls)
        return earliest_finish_pick(dp)


def test_rollout_frees_its_own_episode_and_leaves_a_users_calls_intact():
    """By name, rollout builds the policy and the simulator itself and frees the episode at
    once (Engine.close: nothing left for the collector); a policy object of the user's may
    keep calls, so its episode is not closed and every kept call still has its workflow."""
    import gc

    env = hexagent_gym.make(**SMALL)
    env.rollout("hexagent")  # horizons filled: their standalone runs happen once
    gc.collect()
    gc.disable()
    try:
        by_name = env.rollout("hexagent")
        assert gc.collect() == 0
        keeper = KeepingPicker()
        by_object = env.rollout(keeper)
        assert gc.collect() > 0  # its episode's cycles: left to the collector
    finally:
        gc.enable()
    assert by_name.num_calls == by_object.num_calls
    assert keeper.calls and all(c.workflow is not None for c in keeper.calls)
    assert {c.workflow.spec.workflow_id for c in keeper.calls} <= {
        r.workflow_id for r in by_object.episode.records}


def test_env_bench_reports_the_collectors_share_of_its_timed_runs():
    import gc

    from hexagent_gym.envs.benchmark import bench_env

    callbacks = list(gc.callbacks)
    r = bench_env(cluster="tiny-2p2d", trace="mixed", num_workflows=6, steps=1500, repeat=2)
    assert gc.callbacks == callbacks  # its clock is gone
    assert r.steps == 1500 and r.episodes >= 1 and r.decisions > 0
    assert 0.0 <= r.gc_share < 1.0 and r.steps_per_s > 0 and r.cartpole_steps_per_s > 0
    gc.disable()
    try:  # no collection can run: none is counted
        assert bench_env(cluster="tiny-2p2d", trace="mixed", num_workflows=6, steps=300,
                         repeat=1).gc_share == 0.0
    finally:
        gc.enable()


def test_env_bench_refuses_no_timed_run():
    from hexagent_gym.envs.benchmark import bench_env

    with pytest.raises(ValueError, match=r"repeat >= 1 timed runs, got steps=10, repeat=0"):
        bench_env(cluster="tiny-2p2d", trace="mixed", num_workflows=6, steps=10, repeat=0)
