"""scripts/train.py end to end: a tiny run writes a model that env.rollout accepts and
TensorBoard events with the evaluation scalars (CleanRL-style subprocess smoke test)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hexagent_gym

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "train.py"


def _train_module():
    spec = importlib.util.spec_from_file_location("train_script", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("train")
    cmd = [sys.executable, str(SCRIPT), "--total-timesteps", "1024", "--num-workflows", "20",
           "--logdir", str(logdir), "--out", str(logdir / "model.zip")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return logdir


def test_tiny_run_writes_model_and_run_record(tiny_run):
    assert (tiny_run / "model.zip").is_file()
    assert (tiny_run / "best_model.zip").is_file()
    record = json.loads((tiny_run / "run.json").read_text())
    assert record["final_eval"]["timesteps"] >= 1024
    assert np.isfinite(record["final_eval"]["req99"])


def test_tiny_run_logs_req99_to_tensorboard(tiny_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = list(tiny_run.glob("events.out.tfevents.*"))
    assert events, f"no event file in {tiny_run}"
    acc = EventAccumulator(str(tiny_run))
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    for tag in ("eval/req99", "eval/req95", "eval/mean_ratio", "eval/scheduler_ms",
                "eval/attainment@1.5", "hexagent/req99", "train/loss"):
        assert tag in scalars, f"{tag} missing from {sorted(scalars)}"
    steps = [e.step for e in acc.Scalars("eval/req99")]
    assert steps[0] == 0 and steps[-1] >= 1024
    assert "eval/attainment_curve" in acc.Tags()["images"]


def test_tiny_model_loads_and_rolls_out(tiny_run):
    from sb3_contrib import MaskablePPO

    model = MaskablePPO.load(tiny_run / "model.zip", device="cpu")
    env = hexagent_gym.make(cluster="hetero-1", trace="bfcl_v3", num_workflows=20, load=1.0)
    result = env.rollout(model, seed=0)
    assert result.num_workflows == 20 and np.isfinite(result.req99) and result.req99 >= 1.0
    by_path = env.rollout(str(tiny_run / "model.zip"), seed=0)  # the --out file itself
    np.testing.assert_array_equal(by_path.ratios, result.ratios)


def test_imitation_from_the_lookahead_teacher(tmp_path):
    """--init-from hexagent-lookahead: cloning and one DAgger round from the lookahead teacher,
    logged to TensorBoard and recorded in run.json, then a short PPO stage."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cmd = [sys.executable, str(SCRIPT), "--init-from", "hexagent-lookahead", "--bc-episodes", "1",
           "--bc-epochs", "1", "--dagger-rounds", "1", "--dagger-episodes", "1",
           "--total-timesteps", "256", "--n-steps", "128", "--batch-size", "64",
           "--num-workflows", "12", "--load", "2.0", "--logdir", str(tmp_path),
           "--out", str(tmp_path / "model.zip"), "--verbose", "0"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["args"]["init_from"] == "hexagent-lookahead"
    assert record["bc"]["samples"] > 0 and 0.0 <= record["bc"]["accuracy"] <= 1.0
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    assert "bc/accuracy" in scalars and "dagger/on_policy_accuracy" in scalars


def test_load_flag_is_the_offered_load():
    from hexagent_gym.agents.training import episode_config

    train = _train_module()
    args = train.parse_args(["--load", "1.3", "--cluster", "hetero-2"])
    config, overrides = episode_config(args)
    assert config is None and overrides["load"] == 1.3 and overrides["cluster"] == "hetero-2"
    assert overrides["trace"] == "bfcl_v3"  # training defaults fill the rest
    with pytest.raises(SystemExit):
        train.parse_args(["--load", "model.zip"])  # a path: the error points to --load-model


def test_flags_become_the_train_config():
    from hexagent_gym.agents.training import TrainConfig

    train = _train_module()
    assert train.parse_args([]) == TrainConfig()  # same defaults
    config = train.parse_args(["--eval-seeds", "5,6", "--out", "m.zip", "--n-envs", "3"])
    assert config.eval_seeds == (5, 6) and config.out == Path("m.zip") and config.n_envs == 3


def test_an_invalid_flag_value_is_a_usage_error_naming_the_flag(capsys):
    train = _train_module()
    with pytest.raises(SystemExit) as exc:
        train.parse_args(["--batch-size", "1"])
    assert exc.value.code == 2
    assert "error: --batch-size must be an integer >= 2, got 1" in capsys.readouterr().err
