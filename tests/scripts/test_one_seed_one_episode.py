"""One seed, one episode: for one config and one seed, every entry point runs the same episode.

The entry points: ``env.rollout`` on ``hexagent_gym.make`` (config YAML) and on
``gymnasium.make`` (keyword arguments), ``run_policy`` on ``EpisodeFactory.simulator``, the
``hexagent-gym evaluate`` console command and ``python scripts/evaluate.py``. The policies:
HexAgent, per-call FCFS and a saved MaskablePPO model (the shipped one: through the env's steps in
``env.rollout(path)``, through ``LearnedPolicy`` on the bare simulator, and as a grid entry). The
config pins the env's window K = 16 (docs/env.md, "One seed, one episode").
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import gymnasium as gym
import pytest
import yaml

import hexagent_gym
from hexagent_gym.agents.learned import DEFAULT_MODEL, LearnedPolicy
from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.policy import make_policy, run_policy

ROOT = Path(__file__).resolve().parents[2]
SEED = 7
EPISODE = dict(cluster="hetero-1", trace="bfcl_v3", num_workflows=25, arrival_rate=40.0,
               load=None, max_calls_per_decision=16)
POLICIES = ("hexagent", "fcfs", "saved")


@pytest.fixture(scope="module")
def config_yaml(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("one_seed") / "one_seed.yaml"
    grid = {"policies": ["hexagent", "fcfs",
                         {"name": "learned", "label": "saved",
                          "kwargs": {"model": str(DEFAULT_MODEL)}}],
            "seeds": [SEED]}
    path.write_text(yaml.safe_dump({"name": "one_seed", **EPISODE, "grid": grid}))
    return path


def _grid_req99(out: Path) -> dict[str, float]:
    cells = json.loads((out / "results.json").read_text())["cells"]
    assert all(c["cell"]["episode"]["seed"] == SEED for c in cells)
    return {c["cell"].get("label") or c["cell"]["policy"]: c["metrics"]["req99"] for c in cells}


@pytest.fixture(scope="module")
def command_line(config_yaml, tmp_path_factory) -> dict[str, dict[str, float]]:
    """Req99 per policy from the console command and from the script, each in a fresh process."""
    exe = shutil.which("hexagent-gym", path=sysconfig.get_path("scripts"))
    assert exe is not None, "the hexagent-gym console command is not installed"
    runs = {"console": [exe, "evaluate"],
            "script": [sys.executable, str(ROOT / "scripts" / "evaluate.py")]}
    found = {}
    for name, argv in runs.items():
        out = tmp_path_factory.mktemp(name)
        proc = subprocess.run([*argv, "--config", str(config_yaml), "--out", str(out),
                               "--quiet"], capture_output=True, text=True, cwd=out)
        assert proc.returncode == 0, proc.stderr
        found[name] = _grid_req99(out)
    return found


def _policy(name: str):
    return LearnedPolicy(DEFAULT_MODEL) if name == "saved" else make_policy(name)


@pytest.mark.skipif(not DEFAULT_MODEL.is_file(), reason="shipped model not present")
@pytest.mark.parametrize("name", POLICIES)
def test_every_entry_point_gives_the_same_req99(name, config_yaml, command_line):
    via_env_arg = DEFAULT_MODEL if name == "saved" else name  # a saved model runs env steps
    env = hexagent_gym.make(config_yaml)
    from_make = env.rollout(via_env_arg, seed=SEED)
    from_gym = gym.make(hexagent_gym.ENV_ID, **EPISODE).unwrapped.rollout(via_env_arg, seed=SEED)
    factory = EpisodeFactory(EpisodeConfig(**EPISODE))
    from_sim = run_policy(factory.simulator(seed=SEED), _policy(name))

    assert from_make.episode_seed == from_gym.episode_seed == SEED
    req99 = {"hexagent_gym.make(...).rollout": from_make.req99,
             "gym.make(...).unwrapped.rollout": from_gym.req99,
             "run_policy(factory.simulator(seed))": from_sim.req99,
             "hexagent-gym evaluate": command_line["console"][name],
             "scripts/evaluate.py": command_line["script"][name]}
    assert len(set(req99.values())) == 1, req99
    assert list(from_make.ratios) == list(from_sim.ratios)  # the same episode, not just its tail


def test_reset_seed_is_the_episode_seed():
    env = hexagent_gym.make(**{**EPISODE, "num_workflows": 5})
    assert env.reset(seed=SEED)[1]["episode_seed"] == SEED == env.episode_seed_for(SEED)
    sim = EpisodeFactory(EpisodeConfig(**{**EPISODE, "num_workflows": 5})).simulator(seed=SEED)
    env.reset(seed=SEED)
    assert list(env.unwrapped.simulator.workload.arrivals) == list(sim.workload.arrivals)
    assert list(env.unwrapped.simulator.workload.trace_indices) == list(sim.workload.trace_indices)


def test_the_env_window_is_part_of_the_episode():
    """The env shows K = 16 calls per decision by default, the simulator all of them: at a
    loaded rate the two are different schedulers, which is why the config above pins K (the
    docs say so in one place). A test that would pass with K ignored would prove nothing."""
    loaded = {**EPISODE, "num_workflows": 150, "max_calls_per_decision": None}
    unwindowed = run_policy(EpisodeFactory(EpisodeConfig(**loaded)).simulator(SEED),
                            make_policy("hexagent"))
    env = hexagent_gym.make(**loaded)
    assert env.k == 16
    windowed = env.rollout("hexagent", seed=SEED)
    assert list(windowed.ratios) != list(unwindowed.ratios)
    same = run_policy(EpisodeFactory(EpisodeConfig(**{**loaded, "max_calls_per_decision": 16}))
                      .simulator(SEED), make_policy("hexagent"))
    assert list(windowed.ratios) == list(same.ratios)


def test_a_replayed_public_trace_is_one_episode_through_the_env_and_the_command(tmp_path):
    """A Mooncake file replayed at its own timestamps: the env's rollout and
    ``evaluate --replay`` (same window K) give the same ratios."""
    trace = str(ROOT / "tests" / "fixtures" / "mooncake_small.jsonl")
    replay = dict(cluster="hetero-1", trace=trace, num_workflows=None, load=None,
                  arrival_rate=None, max_calls_per_decision=16)
    via_env = hexagent_gym.make(**replay).rollout("hexagent", seed=0)
    config = tmp_path / "replay.yaml"
    config.write_text(yaml.safe_dump({"name": "replay", "cluster": "hetero-1",
                                      "max_calls_per_decision": 16,
                                      "grid": {"policies": ["hexagent"], "seeds": [0]}}))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "evaluate.py"), "--config",
                           str(config), "--traces", trace, "--replay", "--out", str(out),
                           "--quiet"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    (cell,) = json.loads((out / "results.json").read_text())["cells"]
    assert cell["workflows"]["ratio"] == list(via_env.ratios)
