"""The learned-scheduler layer: equivariant policy shapes and symmetries, masking, save/load,
the LearnedPolicy wrapper (bare simulator = through the env), and behaviour cloning."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch as th

import hexagent_gym
from hexagent_gym.agents.imitation import behaviour_clone, collect_demonstrations, imitation_loss
from hexagent_gym.agents.learned import DEFAULT_MODEL, EquivariantPolicy, LearnedPolicy, make_model

th.set_num_threads(1)

TINY = dict(cluster="tiny-2p2d", trace="bfcl_v3", num_workflows=8, seed=3, load=1.5)
# busy decision points need many calls waiting at once: LATS served without sample groups or
# prompt reuse (these tests check the network's structure, not the serving regime)
SMALL = dict(cluster="hetero-1", trace="lats", num_workflows=4, seed=1, load=2.0,
             prefix_cache=False, parallel_sampling=False, length_predictor="oracle")


def busy_obs(env, min_calls: int = 3, seed: int = 0):
    """Step HexAgent's picks until a decision point shows at least ``min_calls`` unpicked calls."""
    from hexagent_gym.agents.hexagent import HexAgentPolicy

    base = env.unwrapped
    obs, _ = env.reset(seed=seed)
    teacher = HexAgentPolicy()
    teacher.reset(base.simulator)
    while True:
        dp = base.decision_point
        if len(dp.remaining) >= min_calls:
            return obs, base.action_masks()
        obs, _, terminated, _, _ = env.step(base.encode_action(*teacher.pick(dp)))
        assert not terminated, "no busy decision point found"


@pytest.fixture(scope="module")
def small_env():
    return hexagent_gym.make(**SMALL)


@pytest.fixture(scope="module")
def small_model(small_env):
    th.manual_seed(0)
    return make_model(small_env, "equivariant", n_steps=64, batch_size=32, device="cpu")


def logits_of(policy, obs):
    t, _ = policy.obs_to_tensor(obs)
    with th.no_grad():
        return policy.action_logits(t)[0].numpy()


def test_forward_shapes(small_env, small_model):
    policy = small_model.policy
    obs, mask = busy_obs(small_env)
    batch = {k: np.stack([v, v, v]) for k, v in obs.items()}
    t, vectorized = policy.obs_to_tensor(batch)
    assert vectorized
    actions, values, log_prob = policy(t, action_masks=np.stack([mask] * 3))
    n = small_env.action_space.n
    assert actions.shape == (3,) and values.shape == (3, 1) and log_prob.shape == (3,)
    assert policy.action_logits(t).shape == (3, n)
    assert policy.predict_values(t).shape == (3, 1)
    assert np.all(np.isfinite(log_prob.detach().numpy()))


def test_permuting_call_slots_permutes_logits(small_env, small_model):
    policy = small_model.policy
    obs, mask = busy_obs(small_env, min_calls=4)
    K, P, D = obs["delta"].shape
    perm = np.random.default_rng(0).permutation(K)
    permuted = dict(obs, calls=obs["calls"][perm], delta=obs["delta"][perm])
    base = logits_of(policy, obs).reshape(K, P, D)
    moved = logits_of(policy, permuted).reshape(K, P, D)
    np.testing.assert_allclose(moved, base[perm], rtol=1e-5, atol=1e-5)
    # the value head pools over slots: invariant
    v1 = policy.predict_values(policy.obs_to_tensor(obs)[0])
    v2 = policy.predict_values(policy.obs_to_tensor(permuted)[0])
    np.testing.assert_allclose(v1.detach().numpy(), v2.detach().numpy(), rtol=1e-5, atol=1e-5)


def test_permuting_instances_permutes_logits(small_env, small_model):
    policy = small_model.policy
    obs, _ = busy_obs(small_env)
    K, P, D = obs["delta"].shape
    rng = np.random.default_rng(1)
    pp, dd = rng.permutation(P), rng.permutation(D)
    permuted = dict(obs, prefill=obs["prefill"][pp], decode=obs["decode"][dd],
                    delta=obs["delta"][:, pp][:, :, dd])
    base = logits_of(policy, obs).reshape(K, P, D)
    moved = logits_of(policy, permuted).reshape(K, P, D)
    np.testing.assert_allclose(moved, base[:, pp][:, :, dd], rtol=1e-5, atol=1e-5)


def test_padding_changes_no_valid_logit(small_model):
    """Padded instance slots (p_max/d_max) leave the valid logits as they are, so one model
    serves several cluster sizes."""
    plain = hexagent_gym.make(**SMALL)
    padded = hexagent_gym.make(**SMALL, p_max=10, d_max=11)
    obs, mask = busy_obs(plain)
    obs_p, mask_p = busy_obs(padded)
    K, P, D = obs["delta"].shape
    m = mask.reshape(K, P, D)
    m_p = mask_p.reshape(K, 10, 11)
    assert not m_p[:, P:].any() and not m_p[:, :, D:].any()
    np.testing.assert_array_equal(m_p[:, :P, :D], m)
    a = logits_of(small_model.policy, obs).reshape(K, P, D)
    b = logits_of(small_model.policy, obs_p).reshape(K, 10, 11)
    np.testing.assert_allclose(b[:, :P, :D][m], a[m], rtol=1e-5, atol=1e-5)


def test_masked_actions_never_sampled(small_env, small_model):
    obs, mask = busy_obs(small_env)
    for _ in range(200):
        a, _ = small_model.predict(obs, action_masks=mask, deterministic=False)
        assert mask[int(a)]
    t, _ = small_model.policy.obs_to_tensor(obs)
    dist = small_model.policy.get_distribution(t, action_masks=mask[None])
    draws = dist.distribution.sample((2000,)).flatten().numpy()
    assert mask[draws].all()


def test_save_load_round_trip(tmp_path, small_env, small_model):
    from sb3_contrib import MaskablePPO

    path = tmp_path / "m.zip"
    small_model.save(path)
    loaded = MaskablePPO.load(path, device="cpu")
    assert isinstance(loaded.policy, EquivariantPolicy)
    obs, _ = busy_obs(small_env)
    np.testing.assert_array_equal(logits_of(loaded.policy, obs),
                                  logits_of(small_model.policy, obs))
    a = small_env.rollout(small_model, seed=0)
    b = small_env.rollout(loaded, seed=0)
    np.testing.assert_array_equal(a.ratios, b.ratios)
    # env.rollout takes the saved file itself, as a Path or a string
    for saved in (path, str(path)):
        np.testing.assert_array_equal(small_env.rollout(saved, seed=0).ratios, a.ratios)


def test_rollout_of_a_model_path_that_is_missing_or_not_a_model(tmp_path, small_env):
    with pytest.raises(FileNotFoundError, match="no saved model at .*nothing.zip"):
        small_env.rollout(str(tmp_path / "nothing.zip"))
    junk = tmp_path / "junk.zip"
    junk.write_bytes(b"not a zip archive")
    with pytest.raises(ValueError, match="junk.zip is not a MaskablePPO model"):
        small_env.rollout(junk)


def test_learned_policy_on_bare_simulator_equals_env_rollout(small_env, small_model):
    """LearnedPolicy.pick encodes decision points exactly as the env does."""
    through_env = small_env.rollout(small_model, seed=2)
    bare = small_env.rollout(LearnedPolicy(small_model), seed=2)
    np.testing.assert_array_equal(through_env.ratios, bare.ratios)
    assert bare.policy == "learned"


def test_greedy_fast_path_picks_what_predict_picks(small_env):
    """LearnedPolicy's fast path (EquivariantPolicy.greedy_action) against SB3's deterministic
    predict on every state of an episode, for an untrained network (near-uniform logits, where
    ties are likeliest) and a sharp one (prior 4)."""
    env = small_env.unwrapped
    for prior in (0.0, 4.0):
        th.manual_seed(1)
        model = make_model(small_env, "equivariant", policy_kwargs={"prior": prior}, n_steps=64,
                           batch_size=32, device="cpu")
        obs, _ = env.reset(seed=3)
        steps = 0
        while True:
            mask = env.action_masks()
            fast = model.policy.greedy_action(obs, mask)
            slow, _ = model.predict(obs, action_masks=mask, deterministic=True)
            assert fast == int(slow) and mask[fast]
            obs, _, terminated, _, _ = env.step(fast)
            steps += 1
            if terminated:
                break
        assert steps > 50


def test_model_runs_on_another_cluster_size(small_model):
    """Weights are shared over slots: a hetero-1 (8P+8D) model schedules tiny-2p2d and
    hetero-2 (10P+10D) episodes, through the env and on the bare simulator."""
    for cluster in ("tiny-2p2d", "hetero-2"):
        env = hexagent_gym.make(cluster=cluster, trace="bfcl_v3", num_workflows=6, seed=0)
        a = env.rollout(small_model, seed=0)
        b = env.rollout(LearnedPolicy(small_model), seed=0)
        assert a.num_workflows == 6 and np.isfinite(a.req99)
        np.testing.assert_array_equal(a.ratios, b.ratios)


def test_mlp_baseline_policy(small_env):
    model = make_model(small_env, "mlp", n_steps=64, batch_size=32, device="cpu")
    obs, mask = busy_obs(small_env)
    a, _ = model.predict(obs, action_masks=mask, deterministic=False)
    assert mask[int(a)]
    result = small_env.rollout(LearnedPolicy(model), seed=0)
    assert result.num_workflows == SMALL["num_workflows"]
    with pytest.raises(ValueError, match="unknown policy architecture"):
        make_model(small_env, "transformer")


def test_behaviour_cloning_reduces_imitation_loss(small_env):
    th.manual_seed(0)
    model = make_model(small_env, "equivariant", policy_kwargs={"prior": 0.0}, n_steps=64,
                       batch_size=32, device="cpu")
    # seed 1: a busy episode (about 1,200 picks; seed 0's has 138, too few for 5 epochs)
    demos = collect_demonstrations(small_env, [1], gamma=0.99)
    assert len(demos) > 500 and demos.targets[np.arange(len(demos)), demos.actions].all()
    assert (demos.targets <= demos.masks).all()
    before = imitation_loss(model.policy, demos)
    history = behaviour_clone(model.policy, demos, epochs=5, batch_size=32, lr=3e-3)
    after = imitation_loss(model.policy, demos)
    assert after["loss"] < 0.5 * before["loss"]
    assert after["accuracy"] >= 0.9 > before["accuracy"]
    assert history[-1]["loss"] < history[0]["loss"]


def test_dagger_collection_needs_a_learner():
    env = hexagent_gym.make(**TINY)
    with pytest.raises(ValueError, match="learner"):
        collect_demonstrations(env, [0], beta=0.5)
    model = make_model(env, "equivariant", n_steps=64, batch_size=32, device="cpu")
    demos = collect_demonstrations(env, [0], learner=model, beta=0.5,
                                   rng=np.random.default_rng(0))
    assert len(demos) > 0 and demos.masks[np.arange(len(demos)), demos.actions].all()


@pytest.mark.skipif(not DEFAULT_MODEL.is_file(), reason="shipped model not present")
def test_registered_learned_policy_loads_the_shipped_model():
    from hexagent_gym.policy import make_policy

    policy = make_policy("learned")
    assert isinstance(policy, LearnedPolicy) and policy.equivariant
    env = hexagent_gym.make(**TINY)
    assert env.rollout("learned", seed=0).num_workflows == TINY["num_workflows"]


def test_excluded_instance_features_are_not_read(small_env, small_model):
    """GPU identity, sizes and static speeds are left out by default (they let a scorer fit
    on one cluster pick instances by name instead of by Δ)."""
    from hexagent_gym.envs.encoding import PREFILL_FEATURES

    obs, _ = busy_obs(small_env)
    changed = dict(obs, prefill=obs["prefill"].copy())
    cols = [i for i, f in enumerate(PREFILL_FEATURES) if f.startswith("gpu_") or f == "rel_time"]
    changed["prefill"][:, cols] = np.random.default_rng(0).random((obs["prefill"].shape[0],
                                                                  len(cols)))
    np.testing.assert_array_equal(logits_of(small_model.policy, changed),
                                  logits_of(small_model.policy, obs))
    with pytest.raises(ValueError, match="unknown feature"):
        make_model(small_env, "equivariant", policy_kwargs={"exclude_features": ["gpu_tpu"]})


def test_prior_starts_at_hexagent(small_env):
    """With the indicator prior, the untrained policy's argmax is HexAgent's pick."""
    th.manual_seed(0)
    model = make_model(small_env, "equivariant", policy_kwargs={"prior": 4.0}, device="cpu")
    demos = collect_demonstrations(small_env, [0])
    assert imitation_loss(model.policy, demos)["accuracy"] > 0.95


def test_reference_relative_reward_is_zero_for_the_reference():
    """Playing HexAgent's picks against HexAgent earns exactly 0 at every step."""
    from hexagent_gym.agents.hexagent import HexAgentPolicy
    from hexagent_gym.agents.shaping import ReferenceRelativeReward

    env = ReferenceRelativeReward(hexagent_gym.make(**TINY), terminal_weight=5.0)
    base = env.unwrapped
    env.reset(seed=4)
    teacher = HexAgentPolicy()
    teacher.reset(base.simulator)
    rewards = []
    while True:
        _, r, terminated, truncated, info = env.step(
            base.encode_action(*teacher.pick(base.decision_point)))
        rewards.append(r)
        if terminated:
            break
    assert rewards == [0.0] * len(rewards)
    assert info["relative_return"] == 0.0 and info["reference_req99"] >= 1.0
    # a worse policy (always the last waiting call, worst pair) gets a negative return
    env.reset(seed=4)
    total = 0.0
    while True:
        dp = base.decision_point
        slot = dp.remaining[-1]
        row = dp.delta_row(slot)
        masked = np.where(np.isfinite(row), row, -np.inf)
        p, d = divmod(int(np.argmax(masked)), row.shape[1])
        _, r, terminated, _, _ = env.step(base.encode_action(slot, p, d))
        total += r
        if terminated:
            break
    assert total < 0.0


def test_temperature_calibration_keeps_argmax(small_env):
    from hexagent_gym.agents.imitation import calibrate_temperature

    th.manual_seed(0)
    model = make_model(small_env, "equivariant", policy_kwargs={"prior": 8.0}, device="cpu")
    demos = collect_demonstrations(small_env, [0])
    before = imitation_loss(model.policy, demos)
    scale = calibrate_temperature(model.policy, demos, target=0.6)
    after = imitation_loss(model.policy, demos)
    assert 0.0 < scale < 1.0
    assert after["accuracy"] == before["accuracy"]
    assert abs(np.exp(-after["loss"]) - 0.6) < 0.01


# -- the module split: hexagent_gym.agents.learned re-exports the network and the SB3 policy
# ----------------- a pickle (base64, as SB3 stores it in a zip's "data") of the class reference
# agents.learned.EquivariantPolicy, which is what models saved before the split (and before the
# package installed under hexagent_gym) record
PRE_SPLIT_POLICY_CLASS = "gAWVKAAAAAAAAACMDmFnZW50cy5sZWFybmVklIwRRXF1aXZhcmlhbnRQb2xpY3mUk5Qu"


def test_learned_re_exports_the_network_and_the_policy_modules():
    import hexagent_gym.agents.equivariant_net as net
    import hexagent_gym.agents.equivariant_policy as pol
    import hexagent_gym.agents.learned as learned

    for module in (net, pol):
        for name in module.__all__:
            assert getattr(learned, name) is getattr(module, name), name
    for name in ("_C", "_BIG", "_PRESENT", "_PICKED", "_AGE", "_WAIT", "_H_EST", "_MIN_DELTA",
                 "_RISK", "_expand", "_mlp", "_masked_pool", "_masked_extreme"):
        assert getattr(learned, name) is getattr(net, name), name
    assert set(learned.__all__) >= set(net.__all__) | set(pol.__all__) | {
        "DEFAULT_MODEL", "MODELS_DIR", "LearnedPolicy"}


def test_split_modules_import_one_way():
    """learned imports the policy and the network, the policy imports the network; never back
    (imports anywhere in the file count, function-level too)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "agents"

    def imported(name: str) -> set[str]:
        tree = ast.parse((root / f"{name}.py").read_text())
        out = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        return out

    assert not imported("equivariant_net") & {"hexagent_gym.agents.learned",
                                              "hexagent_gym.agents.equivariant_policy"}
    assert "hexagent_gym.agents.learned" not in imported("equivariant_policy")


def test_a_model_saved_before_the_split_still_loads(tmp_path, small_env, small_model):
    """A zip whose policy class is recorded as ``agents.learned.EquivariantPolicy`` (its name
    before the split and before the package installed under hexagent_gym) loads into the same
    class with the same logits, in a process where no top-level ``agents`` is importable."""
    import json
    import zipfile


    saved = tmp_path / "new.zip"
    small_model.save(saved)
    old = tmp_path / "old.zip"
    with zipfile.ZipFile(saved) as src, zipfile.ZipFile(old, "w") as dst:
        for item in src.infolist():
            blob = src.read(item)
            if item.filename == "data":
                data = json.loads(blob)
                data["policy_class"][":serialized:"] = PRE_SPLIT_POLICY_CLASS
                blob = json.dumps(data, indent=4).encode()
            dst.writestr(item, blob)
    from hexagent_gym.agents.saved_models import load_saved_model

    # pytest puts the checkout's root on sys.path, so a top-level `agents` would import here
    # as a second copy of the package: `is` holds only if the name was read as hexagent_gym's
    loaded = load_saved_model(old)
    assert type(loaded.policy) is EquivariantPolicy
    obs, _ = busy_obs(small_env)
    np.testing.assert_array_equal(logits_of(loaded.policy, obs),
                                  logits_of(small_model.policy, obs))
    code = ("import sys, hexagent_gym\n"
            "from hexagent_gym.agents.saved_models import load_saved_model\n"
            f"model = load_saved_model({str(old)!r})\n"
            "assert 'agents' not in sys.modules and 'envs' not in sys.modules\n"
            "print(type(model.policy).__module__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "hexagent_gym.agents.equivariant_policy"


@pytest.mark.skipif(not DEFAULT_MODEL.is_file(), reason="shipped model not present")
def test_every_shipped_model_loads_as_the_equivariant_policy():
    import json
    import pickle
    import zipfile
    from base64 import b64decode

    from sb3_contrib import MaskablePPO

    for path in sorted(DEFAULT_MODEL.parent.glob("*.zip")):
        with zipfile.ZipFile(path) as zf:
            recorded = json.loads(zf.read("data"))["policy_class"][":serialized:"]
        assert pickle.loads(b64decode(recorded)) is EquivariantPolicy, path.name
        assert type(MaskablePPO.load(path, device="cpu").policy) is EquivariantPolicy, path.name
