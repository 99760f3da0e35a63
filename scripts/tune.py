"""Ray Tune sweep over PPO hyperparameters of the learned scheduler; one training run
(hexagent_gym.agents.training.train, in the trial's process) per trial, each logging to TensorBoard
in its trial directory.

Usage:
    python scripts/tune.py                                   # 4 trials x 2048 steps, local Ray
    python scripts/tune.py --num-samples 8 --total-timesteps 50000 --logdir runs/tune
    python scripts/tune.py --address HEAD:6379 --num-samples 16 -- --num-workflows 100
    tensorboard --logdir runs/tune/ppo_sweep

Search space (random search, seeded by --seed): learning rate log-uniform in [3e-5, 1e-3],
rollout steps per env n_steps in {128, 256, 512}, entropy coefficient in {0, 0.001, 0.01}.
Every trial trains with those values, the shared flags below and the scripts/train.py flags after
`--` (e.g. `-- --num-workflows 100 --init-from hexagent`), read by train.py's own parser into a
TrainConfig before Ray starts; it reports each evaluation's eval/req99 to Tune as it runs and the
best at the end. Layout: <logdir>/<name>/<trial>/train/ holds the trial's TensorBoard events,
progress.csv, run.json and models, <trial>/train.log its output and command.txt the train.py
command line that reruns it alone; <trial>/ itself holds Tune's result.json, progress.csv and
events; the sweep's table goes to <logdir>/<name>/sweep.json. Needs ray[tune];
docs/distributed.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from hexagent_gym.agents.training import TrainConfig, train

ROOT = Path(__file__).resolve().parents[1]
TRAIN_SCRIPT = ROOT / "scripts" / "train.py"
METRIC = "best_req99"
"""What a trial minimises: the lowest eval/req99 it has reached so far."""
EVAL_TAGS = ("req99", "req95", "mean_ratio")
PER_TRIAL = ("--lr", "--n-steps", "--ent-coef", "--logdir", "--out")
"""train.py flags every trial sets itself (sampled or its directory): not allowed after --."""


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--num-samples", type=int, default=4, help="trials (random search)")
    p.add_argument("--total-timesteps", type=int, default=2048, help="PPO steps per trial")
    p.add_argument("--eval-every", type=int,
                   help="env steps between evaluations (default total-timesteps / 2)")
    p.add_argument("--num-workflows", type=int,
                   help="workflows per training episode (default: train.py's)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the search and of every trial's training")
    p.add_argument("--address", help="join this Ray cluster (HEAD:6379, auto) instead of "
                   "starting a local one")
    p.add_argument("--workers", type=int,
                   help="CPUs of the local Ray instance (default: every core)")
    p.add_argument("--cpus-per-trial", type=float, default=1.0)
    p.add_argument("--max-concurrent", type=int, help="trials at once (default: as CPUs allow)")
    p.add_argument("--logdir", type=Path, default=Path("runs/tune"),
                   help="Tune storage path; the sweep lands in <logdir>/<name>")
    p.add_argument("--name", default="ppo_sweep", help="experiment name")
    p.add_argument("--resume", action="store_true",
                   help="continue the sweep in <logdir>/<name> (unfinished and errored trials)")
    p.add_argument("--train-script", type=Path, default=TRAIN_SCRIPT,
                   help="train.py whose flag parser reads the trials' flags")
    p.add_argument("--poll", type=float, default=5.0,
                   help="unused: trials report each evaluation as it runs (kept so that "
                   "existing command lines run)")
    args = p.parse_args(argv)
    if args.num_samples < 1 or args.total_timesteps < 1:
        p.error("--num-samples and --total-timesteps must be >= 1")
    if args.address and args.workers is not None:
        p.error("--workers sizes a local Ray instance; a cluster's nodes set theirs with "
                "`ray start --num-cpus N`")
    args.logdir = args.logdir.resolve()
    return args, extra


def load_train_script(path: Path) -> Any:
    """scripts/train.py (or another script with its ``parse_args``) as a module."""
    spec = importlib.util.spec_from_file_location("hexagent_train_script", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"not a Python file: {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def search_space() -> dict[str, Any]:
    from ray import tune

    return {"lr": tune.loguniform(3e-5, 1e-3),
            "n_steps": tune.choice([128, 256, 512]),
            "ent_coef": tune.choice([0.0, 0.001, 0.01])}


def shared_flags(args: argparse.Namespace, extra: list[str]) -> list[str]:
    """The scripts/train.py flags every trial shares: this script's, then those after --."""
    return ["--total-timesteps", str(args.total_timesteps),
            "--eval-every", str(args.eval_every or max(1, args.total_timesteps // 2)),
            *(["--num-workflows", str(args.num_workflows)] if args.num_workflows else []),
            "--seed", str(args.seed), "--threads", "1", "--verbose", "1", *extra]


def trial_config(base: TrainConfig, config: dict[str, Any], trial_dir: Path) -> TrainConfig:
    """One trial's TrainConfig: the shared one with the sampled values, in the trial's directory."""
    out = trial_dir / "train"
    return dataclasses.replace(base, lr=float(config["lr"]), n_steps=int(config["n_steps"]),
                               ent_coef=float(config["ent_coef"]), logdir=out,
                               out=out / "model.zip")


def train_command(config: TrainConfig, settings: dict[str, Any]) -> list[str]:
    """A scripts/train.py command line that runs the trial ``config`` alone."""
    return [sys.executable, str(settings["train_script"]),
            "--lr", repr(config.lr), "--n-steps", str(config.n_steps),
            "--ent-coef", repr(config.ent_coef), *settings["flags"],
            "--logdir", str(config.logdir), "--out", str(config.out)]


def trial_directory(settings: dict[str, Any]) -> Path:
    """The trial's directory under the sweep's storage path (<logdir>/<name>/<trial>).

    Tune's own trial directory is a staging copy in the Ray session that it syncs to the
    storage path; the trial's training writes straight to the storage path instead, so
    TensorBoard can follow a sweep live. On a multi-node cluster the storage path must be
    shared (NFS).
    """
    from ray import tune

    staged = Path(tune.get_context().get_trial_dir())
    return Path(settings["storage"]) / settings["name"] / staged.name


def trial_dirname(trial: Any) -> str:
    """Short trial directory names (TensorBoard shows them as run names)."""
    c = trial.config
    return (f"trial_{trial.trial_id}_lr{float(c['lr']):.1e}_n{int(c['n_steps'])}"
            f"_ent{float(c['ent_coef']):g}")


def run_trial(config: dict[str, Any], settings: dict[str, Any]) -> None:
    """A Tune function trainable: train, report each evaluation as it runs, then the summary."""
    from ray import tune

    trial_dir = trial_directory(settings)
    trial_dir.mkdir(parents=True, exist_ok=True)
    if (trial_dir / "train").exists():  # a restarted trial (--resume): keep the old logs apart
        n = 1
        while (trial_dir / f"train.attempt{n}").exists():
            n += 1
        (trial_dir / "train").rename(trial_dir / f"train.attempt{n}")
    train_config = trial_config(settings["base"], config, trial_dir)
    (trial_dir / "command.txt").write_text(shlex.join(train_command(train_config, settings))
                                           + "\n")
    best = float("inf")

    def report(row: dict[str, float]) -> None:
        nonlocal best
        best = min(best, row["req99"])
        tune.report({"timesteps": row["timesteps"],
                     **{f"eval_{name}": row[name] for name in EVAL_TAGS}, METRIC: best})

    with (trial_dir / "train.log").open("w") as log, contextlib.redirect_stdout(log), \
            contextlib.redirect_stderr(log):
        result = train(train_config, on_eval=report)
        print(result.summary())
    tune.report({"timesteps": result.final_eval["timesteps"], METRIC: result.best_req99,
                 "done": True, "final_req99": result.req99,
                 "hexagent_req99": result.reference["req99"], "best_step": result.best_step})


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(argv)
    try:
        from ray import tune
        from ray.tune.search.basic_variant import BasicVariantGenerator
    except ImportError as exc:
        print(f'error: the sweep needs Ray Tune: pip install "ray[tune]" ({exc})',
              file=sys.stderr)
        return 2
    from hexagent_gym.experiments.ray_backend import ray_session

    # The trials' flags go through train.py's own parser before anything starts.
    taken = [a for a in extra if a.split("=")[0] in PER_TRIAL]
    if taken:
        print(f"error: each trial sets {', '.join(PER_TRIAL)} itself; drop "
              f"{', '.join(taken)} after --", file=sys.stderr)
        return 2
    flags = shared_flags(args, extra)
    try:
        base = load_train_script(args.train_script).parse_args(flags)
    except (OSError, ImportError) as exc:
        print(f"error: cannot load {args.train_script}: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # its parser has printed the usage error (or, -- --help, its help)
        if exc.code:
            print(f"error: invalid train.py flags {shlex.join(flags)}", file=sys.stderr)
        return 2 if exc.code else 0
    settings = {"train_script": args.train_script.resolve(), "base": base, "flags": flags,
                "storage": str(args.logdir), "name": args.name}

    exp_dir = args.logdir / args.name
    trainable = tune.with_resources(tune.with_parameters(run_trial, settings=settings),
                                    {"cpu": args.cpus_per_trial})
    with ray_session(args.address, args.workers):
        if args.resume and tune.Tuner.can_restore(str(exp_dir)):
            tuner = tune.Tuner.restore(str(exp_dir), trainable, resume_errored=True)
        else:
            tuner = tune.Tuner(
                trainable, param_space=search_space(),
                tune_config=tune.TuneConfig(
                    metric=METRIC, mode="min", num_samples=args.num_samples,
                    max_concurrent_trials=args.max_concurrent,
                    search_alg=BasicVariantGenerator(random_state=args.seed),
                    trial_dirname_creator=trial_dirname),
                run_config=tune.RunConfig(name=args.name, storage_path=str(args.logdir),
                                          verbose=1))
        start = time.perf_counter()
        results = tuner.fit()
        elapsed = time.perf_counter() - start
    rows = []
    for res in results:
        m = res.metrics or {}
        rows.append({"trial": Path(res.path).name, "path": res.path,
                     "lr": res.config.get("lr"), "n_steps": res.config.get("n_steps"),
                     "ent_coef": res.config.get("ent_coef"), METRIC: m.get(METRIC),
                     "final_req99": m.get("final_req99"), "hexagent_req99": m.get("hexagent_req99"),
                     "error": None if res.error is None else str(res.error).splitlines()[0]})
    rows.sort(key=lambda r: (r[METRIC] is None, r[METRIC] or 0.0))
    exp_dir.mkdir(parents=True, exist_ok=True)
    (exp_dir / "sweep.json").write_text(json.dumps({"elapsed_s": elapsed, "trials": rows},
                                                   indent=1) + "\n")
    print(f"\n{len(rows)} trials in {elapsed:.0f} s ({exp_dir}); lowest eval Req99 first:")
    print("| trial | lr | n_steps | ent_coef | best req99 | final req99 | hexagent req99 |")
    print("|---|---|---|---|---|---|---|")

    def num(v: Any) -> str:
        return "–" if v is None else f"{v:.3f}"

    for r in rows:
        status = f" ({r['error']})" if r["error"] else ""
        print(f"| {r['trial']}{status} | {r['lr']:.2e} | {r['n_steps']} | {r['ent_coef']} | "
              f"{num(r[METRIC])} | {num(r['final_req99'])} | {num(r['hexagent_req99'])} |")
    print(f"TensorBoard: tensorboard --logdir {exp_dir}")
    return 1 if results.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
