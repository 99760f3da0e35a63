"""Ray Tune sweep over PPO hyperparameters of the learned scheduler; one scripts/train.py run
per trial, each logging to TensorBoard in its trial directory.

Usage:
    python scripts/tune.py                                   # 4 trials x 2048 steps, local Ray
    python scripts/tune.py --num-samples 8 --total-timesteps 50000 --logdir runs/tune
    python scripts/tune.py --address HEAD:6379 --num-samples 16 -- --num-workflows 100
    tensorboard --logdir runs/tune/ppo_sweep

Search space (random search, seeded by --seed): learning rate log-uniform in [3e-5, 1e-3],
rollout steps per env n_steps in {128, 256, 512}, entropy coefficient in {0, 0.001, 0.01}.
Every trial runs `scripts/train.py` as a subprocess with those flags, the shared flags below and
anything after `--` (e.g. `-- --num-workflows 100 --init-from hexagent`); it reports
eval/req99 to Tune as train.py logs it (read back from the TensorBoard events) and the best at the
end. Layout: <logdir>/<name>/<trial>/train/ holds the trial's TensorBoard events, progress.csv,
run.json and models; <trial>/ itself holds Tune's result.json, progress.csv and events; the
sweep's table goes to <logdir>/<name>/sweep.json. Needs ray[tune]; docs/distributed.md.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRAIN_SCRIPT = ROOT / "scripts" / "train.py"
METRIC = "best_req99"
"""What a trial minimises: the lowest eval/req99 it has reached so far."""
EVAL_TAGS = ("req99", "req95", "mean_ratio")


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
                   help="train.py to run (its path must exist on every node)")
    p.add_argument("--poll", type=float, default=5.0, help="seconds between metric reads")
    args = p.parse_args(argv)
    if args.num_samples < 1 or args.total_timesteps < 1:
        p.error("--num-samples and --total-timesteps must be >= 1")
    if args.address and args.workers is not None:
        p.error("--workers sizes a local Ray instance; a cluster's nodes set theirs with "
                "`ray start --num-cpus N`")
    args.logdir = args.logdir.resolve()
    return args, extra


def search_space() -> dict[str, Any]:
    from ray import tune

    return {"lr": tune.loguniform(3e-5, 1e-3),
            "n_steps": tune.choice([128, 256, 512]),
            "ent_coef": tune.choice([0.0, 0.001, 0.01])}


def train_command(config: dict[str, Any], settings: dict[str, Any], trial_dir: Path) -> list[str]:
    """The scripts/train.py command line of one trial."""
    out = trial_dir / "train"
    return [sys.executable, str(settings["train_script"]),
            "--lr", repr(float(config["lr"])), "--n-steps", str(int(config["n_steps"])),
            "--ent-coef", repr(float(config["ent_coef"])),
            "--total-timesteps", str(settings["total_timesteps"]),
            "--eval-every", str(settings["eval_every"]),
            *(["--num-workflows", str(settings["num_workflows"])]
              if settings["num_workflows"] else []),
            "--seed", str(settings["seed"]), "--threads", "1", "--verbose", "1",
            "--logdir", str(out), "--out", str(out / "model.zip"), *settings["extra"]]


def trial_directory(settings: dict[str, Any]) -> Path:
    """The trial's directory under the sweep's storage path (<logdir>/<name>/<trial>).

    Tune's own trial directory is a staging copy in the Ray session that it syncs to the
    storage path; train.py writes straight to the storage path instead, so TensorBoard can
    follow a sweep live. On a multi-node cluster the storage path must be shared (NFS).
    """
    from ray import tune

    staged = Path(tune.get_context().get_trial_dir())
    return Path(settings["storage"]) / settings["name"] / staged.name


def read_evals(logdir: Path) -> dict[int, dict[str, float]]:
    """eval/* scalars train.py has written to its TensorBoard events so far, by step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not logdir.is_dir():
        return {}
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags().get("scalars", []))
    out: dict[int, dict[str, float]] = {}
    for name in EVAL_TAGS:
        if f"eval/{name}" in tags:
            for event in acc.Scalars(f"eval/{name}"):
                out.setdefault(int(event.step), {})[f"eval_{name}"] = float(event.value)
    return {s: v for s, v in out.items() if "eval_req99" in v}


def trial_dirname(trial: Any) -> str:
    """Short trial directory names (TensorBoard shows them as run names)."""
    c = trial.config
    return (f"trial_{trial.trial_id}_lr{float(c['lr']):.1e}_n{int(c['n_steps'])}"
            f"_ent{float(c['ent_coef']):g}")


def run_trial(config: dict[str, Any], settings: dict[str, Any]) -> None:
    """A Tune function trainable: run train.py, report each evaluation, then the summary."""
    from ray import tune

    trial_dir = trial_directory(settings)
    trial_dir.mkdir(parents=True, exist_ok=True)
    if (trial_dir / "train").exists():  # a restarted trial (--resume): keep the old logs apart
        n = 1
        while (trial_dir / f"train.attempt{n}").exists():
            n += 1
        (trial_dir / "train").rename(trial_dir / f"train.attempt{n}")
    cmd = train_command(config, settings, trial_dir)
    (trial_dir / "command.txt").write_text(shlex.join(cmd) + "\n")
    best = float("inf")
    reported: set[int] = set()

    def report_new() -> None:
        nonlocal best
        for step, values in sorted(read_evals(trial_dir / "train").items()):
            if step in reported:
                continue
            reported.add(step)
            best = min(best, values["eval_req99"])
            tune.report({"timesteps": step, **values, METRIC: best})

    with (trial_dir / "train.log").open("w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None:
                time.sleep(settings["poll"])
                report_new()
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
    if proc.returncode != 0:
        tail = (trial_dir / "train.log").read_text()[-2000:]
        raise RuntimeError(f"train.py exited with status {proc.returncode}; log tail:\n{tail}")
    report_new()
    run = trial_dir / "train" / "run.json"
    summary: dict[str, Any] = {}
    if run.is_file():
        rec = json.loads(run.read_text())
        summary = {"final_req99": (rec.get("final_eval") or {}).get("req99"),
                   "hexagent_req99": (rec.get("reference") or {}).get("req99"),
                   "best_step": rec.get("best_step")}
        if isinstance(rec.get("best_eval_req99"), int | float):
            best = min(best, float(rec["best_eval_req99"]))
    if best == float("inf"):
        raise RuntimeError("train.py finished without an eval/req99 (see train.log)")
    tune.report({"timesteps": max(reported, default=settings["total_timesteps"]),
                 METRIC: best, "done": True,
                 **{k: v for k, v in summary.items() if v is not None}})


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(argv)
    try:
        from ray import tune
        from ray.tune.search.basic_variant import BasicVariantGenerator
    except ImportError as exc:
        print(f'error: the sweep needs Ray Tune: pip install "ray[tune]" ({exc})',
              file=sys.stderr)
        return 2
    from hexagent_gym.distributed import ray_session

    settings = {"train_script": args.train_script.resolve(),
                "total_timesteps": args.total_timesteps,
                "eval_every": args.eval_every or max(1, args.total_timesteps // 2),
                "num_workflows": args.num_workflows, "seed": args.seed, "extra": extra,
                "poll": args.poll, "storage": str(args.logdir), "name": args.name}
    # Check the trial command line before starting anything (train.py's own parser).
    check = train_command({"lr": 1e-4, "n_steps": 128, "ent_coef": 0.0}, settings, Path("x"))
    proc = subprocess.run([*check[:2], "--help"], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        print(f"error: {args.train_script} --help failed:\n{proc.stderr[-2000:]}",
              file=sys.stderr)
        return 2
    known = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", proc.stdout))
    unknown = [a for a in extra if a.startswith("--") and a.split("=")[0] not in known]
    if unknown:
        print(f"error: train.py has no flag {', '.join(unknown)}", file=sys.stderr)
        return 2

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
