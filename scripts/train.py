"""Train a learned scheduler with MaskablePPO on PDCluster-v0 (optionally warm-started by behaviour
cloning HexAgent), logging to TensorBoard.

Usage:
    python scripts/train.py --total-timesteps 1024 --num-workflows 20 --logdir runs/smoke \\
        --out runs/smoke/model.zip
    python scripts/train.py --init-from hexagent --total-timesteps 150000 --logdir runs/hetero1 \\
        --out models/learned_hetero1_bfcl.zip          # the shipped model (docs/learned.md)
    tensorboard --logdir runs

Episodes: the experiment config (--config, a YAML path or a configs/experiments name; only its
episode keys apply) over the training defaults below, then the flags. Sub-env i starts from the
config seed + i, so the envs sample different episodes. Evaluation episodes use seeds
--eval-seeds on the same config (or --eval-num-workflows). Outputs in --logdir: TensorBoard
events (eval/req99, hexagent/req99, train/*, rollout/*, bc/*), progress.csv, best_model.zip
(lowest eval/req99), run.json (arguments, timings, final numbers). The final model goes to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

TRAIN_DEFAULTS: dict[str, Any] = {
    "cluster": "hetero-1",
    "trace": "bfcl_v3",
    "num_workflows": 100,
    "load": 1.0,
}
"""Training episodes unless --config or flags say otherwise: small enough (≈ 1,000 picks) that
PPO sees many terminal rewards, loaded enough that queues form."""


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}"
                                         ) from None


def _load(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--load is the offered prefill load (a number), got {text!r}; to continue from a "
            f"saved model use --load-model {text}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    env = p.add_argument_group("episodes")
    env.add_argument("--config", help="experiment YAML path or shipped name; its episode keys "
                     "override the training defaults")
    env.add_argument("--cluster", help=f"cluster (default {TRAIN_DEFAULTS['cluster']})")
    env.add_argument("--trace", help=f"trace (default {TRAIN_DEFAULTS['trace']})")
    env.add_argument("--num-workflows", type=int,
                     help=f"workflows per episode (default {TRAIN_DEFAULTS['num_workflows']})")
    env.add_argument("--load", type=_load,
                     help=f"offered prefill load ρ, as in scripts/evaluate.py (default "
                     f"{TRAIN_DEFAULTS['load']}); --load-model continues from a saved model")
    env.add_argument("--p-max", type=int, help="pad prefill slots (for --policy mlp transfer)")
    env.add_argument("--d-max", type=int, help="pad decode slots (for --policy mlp transfer)")
    env.add_argument("--reward", default="tail", help="env reward name (envs/rewards.py)")
    env.add_argument("--target-alpha", type=float, help="α of the reward (env default 1.5)")
    env.add_argument("--terminal-weight", type=float,
                     help="weight of the tail reward's terminal −(Req99 − 1) term (default 1)")
    env.add_argument("--relative-to", choices=("none", "hexagent"), default="none",
                     help="train on the reward relative to this policy on the same episode "
                     "(agents/shaping.py)")
    env.add_argument("--n-envs", type=int, default=2, help="parallel training envs")
    env.add_argument("--vec", choices=("dummy", "subproc"), default="dummy",
                     help="DummyVecEnv (one process) or SubprocVecEnv")
    algo = p.add_argument_group("model")
    algo.add_argument("--policy", choices=("equivariant", "mlp"), default="equivariant")
    algo.add_argument("--load-model", type=Path,
                      help="continue training this saved model (.zip)")
    algo.add_argument("--init-from", choices=("none", "hexagent", "hexagent-lookahead"),
                      default="none", help="behaviour-clone this teacher before PPO: HexAgent, "
                      "or HexAgent with a one-step lookahead over its pick order "
                      "(agents/lookahead.py)")
    algo.add_argument("--total-timesteps", type=int, default=100_000)
    algo.add_argument("--lr", type=float, default=1e-4, help="PPO learning rate")
    algo.add_argument("--n-steps", type=int, default=512, help="rollout steps per env")
    algo.add_argument("--batch-size", type=int, default=256)
    algo.add_argument("--n-epochs", type=int, default=4)
    algo.add_argument("--gamma", type=float, default=0.995)
    algo.add_argument("--gae-lambda", type=float, default=0.95)
    algo.add_argument("--clip-range", type=float, default=0.1)
    algo.add_argument("--ent-coef", type=float, default=0.001)
    algo.add_argument("--hidden", type=int, default=64, help="equivariant embedding width")
    algo.add_argument("--prior", type=float, default=4.0,
                      help="initial weight of the equivariant policy's HexAgent indicators")
    bc = p.add_argument_group("behaviour cloning (--init-from)")
    bc.add_argument("--bc-episodes", type=int, default=8, help="teacher episodes to imitate")
    bc.add_argument("--bc-epochs", type=int, default=3)
    bc.add_argument("--bc-lr", type=float, default=3e-3)
    bc.add_argument("--bc-value-coef", type=float, default=0.5,
                    help="weight of the critic's regression on returns (0: actor only)")
    bc.add_argument("--dagger-rounds", type=int, default=2,
                    help="DAgger rounds after cloning (learner's greedy states, teacher labels)")
    bc.add_argument("--dagger-episodes", type=int, default=4, help="episodes per DAgger round")
    bc.add_argument("--bc-target-prob", type=float, default=0.0,
                    help="after cloning, lower the equivariant policy's logit scale until it "
                    "gives the teacher's pick this (geometric-mean) probability, so PPO "
                    "explores; 0 keeps the cloned sharpness")
    ev = p.add_argument_group("evaluation and output")
    ev.add_argument("--eval-every", type=int, default=10_000, help="env steps between evals")
    ev.add_argument("--eval-seeds", type=_ints, default=[10_000],
                    help="comma-separated reset seeds of the evaluation episodes")
    ev.add_argument("--eval-num-workflows", type=int,
                    help="workflows per evaluation episode (default: as training)")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--threads", type=int, default=1, help="torch threads (2 cores here)")
    ev.add_argument("--logdir", type=Path, default=Path("runs/learned"))
    ev.add_argument("--out", type=Path, help="final model path (default <logdir>/model.zip)")
    ev.add_argument("--verbose", type=int, default=1, help="0 quiet, 1 eval lines, 2 + SB3 table")
    return p.parse_args(argv)


def episode_config(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """(config for the env, keyword overrides) from the defaults, --config and the flags."""
    overrides: dict[str, Any] = {} if args.config else dict(TRAIN_DEFAULTS)
    for key in ("cluster", "trace", "num_workflows", "load", "p_max", "d_max"):
        value = getattr(args, key)
        if value is not None:
            overrides[key] = value
    if args.load is not None:
        overrides["arrival_rate"] = None
    overrides.update(seed=args.seed, reward=args.reward)
    if args.target_alpha is not None:
        overrides["target_alpha"] = args.target_alpha
    if args.terminal_weight is not None and args.relative_to == "none":
        overrides["reward_kwargs"] = {"terminal_weight": args.terminal_weight}
    return args.config, overrides


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(max(1, args.threads))
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.logger import configure
    from stable_baselines3.common.utils import set_random_seed
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecMonitor

    from agents.callbacks import RolloutEvalCallback
    from agents.imitation import (
        behaviour_clone,
        calibrate_temperature,
        collect_demonstrations,
        dagger,
        imitation_loss,
    )
    from agents.learned import make_model
    from agents.shaping import ReferenceRelativeReward, relative_env_fn
    from envs.pd_cluster_env import PDClusterEnv, make_env_fn
    from hexagent_gym.config import ConfigError
    from hexagent_gym.policy import make_policy

    set_random_seed(args.seed)  # the only global seeding; envs seed from their config
    config, overrides = episode_config(args)
    try:
        fns = [make_env_fn(config, rank=i, **overrides) for i in range(args.n_envs)]
        shaping = {}
        if args.relative_to != "none":
            shaping = {"reference": args.relative_to}
            if args.terminal_weight is not None:
                shaping["terminal_weight"] = args.terminal_weight
            fns = [relative_env_fn(fn, **shaping) for fn in fns]
        eval_over = dict(overrides)
        if args.eval_num_workflows:
            eval_over["num_workflows"] = args.eval_num_workflows
        eval_env = PDClusterEnv(config, **eval_over)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    vec = VecMonitor(SubprocVecEnv(fns) if args.vec == "subproc" else DummyVecEnv(fns))
    args.logdir.mkdir(parents=True, exist_ok=True)
    out = args.out or args.logdir / "model.zip"
    formats = ["tensorboard", "csv"] + (["stdout"] if args.verbose >= 2 else [])
    logger = configure(str(args.logdir), formats)

    ppo_kwargs = dict(learning_rate=args.lr, n_steps=args.n_steps, batch_size=args.batch_size,
                      n_epochs=args.n_epochs, gamma=args.gamma, gae_lambda=args.gae_lambda,
                      clip_range=args.clip_range, ent_coef=args.ent_coef, device="cpu",
                      verbose=0)
    if args.load_model:
        # models saved before an observation key existed (e.g. `cached`) load against today's
        # space; the network reads only the keys it was built for
        model = MaskablePPO.load(args.load_model, env=vec, device="cpu",
                                 custom_objects={"observation_space": vec.observation_space}, **{
                                     k: v for k, v in ppo_kwargs.items()
                                     if k not in ("device", "verbose")})
    else:
        policy_kwargs = ({"hidden": args.hidden, "prior": args.prior}
                         if args.policy == "equivariant" else None)
        model = make_model(vec, args.policy, policy_kwargs=policy_kwargs, **ppo_kwargs)
    model.set_logger(logger)

    timings: dict[str, float] = {}
    bc_stats: dict[str, Any] = {}
    if args.init_from != "none":
        start = time.perf_counter()
        teacher = make_policy(args.init_from)
        demo_env = PDClusterEnv(config, **overrides)
        if shaping:
            demo_env = ReferenceRelativeReward(demo_env, **shaping)
        demos = collect_demonstrations(demo_env, range(20_000, 20_000 + args.bc_episodes),
                                       gamma=args.gamma, teacher=teacher)
        held_out = collect_demonstrations(demo_env, [30_000], gamma=args.gamma, teacher=teacher)
        timings["bc_collect_s"] = time.perf_counter() - start

        def log_epoch(epoch: int, stats: dict[str, float]) -> None:
            for k, v in stats.items():
                logger.record(f"bc/{k}", v)
            logger.record("bc/held_out_loss", imitation_loss(model.policy, held_out)["loss"])
            logger.dump(epoch + 1)
            if args.verbose:
                print(f"[bc] epoch {epoch + 1}: loss {stats['loss']:.4f}, accuracy "
                      f"{stats['accuracy']:.4f}, value loss {stats['value_loss']:.4f}",
                      flush=True)

        behaviour_clone(model.policy, demos, epochs=args.bc_epochs, lr=args.bc_lr,
                        value_coef=args.bc_value_coef, seed=args.seed, log=log_epoch)

        def log_round(r: int, stats: dict[str, float]) -> None:
            for k, v in stats.items():
                logger.record(f"dagger/{k}", v)
            logger.dump(r + 1)
            if args.verbose:
                print(f"[dagger] round {r + 1}: accuracy on the learner's own states "
                      f"{stats['on_policy_accuracy']:.4f} before refitting", flush=True)

        if args.dagger_rounds:
            demos = dagger(model.policy, demo_env, demos, rounds=args.dagger_rounds,
                           episodes=args.dagger_episodes, gamma=args.gamma,
                           value_coef=args.bc_value_coef, seed=args.seed, teacher=teacher,
                           log=log_round)
        if args.bc_target_prob > 0.0:
            scale = calibrate_temperature(model.policy, held_out, args.bc_target_prob)
            bc_stats["logit_scale"] = scale
            if args.verbose:
                print(f"[bc] logit scale {scale:.4f}: teacher pick probability "
                      f"{args.bc_target_prob} on held-out states", flush=True)
        bc_stats.update(samples=len(demos), **imitation_loss(model.policy, held_out))
        timings["bc_total_s"] = time.perf_counter() - start
        if args.verbose:
            print(f"[bc] {len(demos)} labelled states ({args.bc_episodes} teacher episodes + "
                  f"{args.dagger_rounds} DAgger rounds); held-out "
                  f"accuracy {bc_stats['accuracy']:.4f} ({timings['bc_total_s']:.0f} s)",
                  flush=True)

    cb = RolloutEvalCallback(
        eval_env, eval_every=args.eval_every, seeds=args.eval_seeds,
        hparams={"env_cluster": eval_env.config.cluster, "env_trace": eval_env.config.trace,
                 "num_workflows": eval_env.config.num_workflows,
                 "load": overrides.get("load", eval_env.config.load), "init_from": args.init_from,
                 "policy_arch": args.policy, "total_timesteps": args.total_timesteps,
                 "relative_to": args.relative_to, "reward": args.reward},
        best_model_path=args.logdir / "best_model.zip", verbose=args.verbose)
    start = time.perf_counter()
    model.learn(args.total_timesteps, callback=cb, reset_num_timesteps=args.load_model is None)
    timings["ppo_s"] = time.perf_counter() - start
    out.parent.mkdir(parents=True, exist_ok=True)
    model.save(out)
    vec.close()
    final = cb.history[-1] if cb.history else {}
    record = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "config": config, "overrides": overrides, "timings": timings, "bc": bc_stats,
              "final_eval": final, "best_eval_req99": cb.best_req99, "best_step": cb.best_step,
              "reference": cb.reference_stats, "history": cb.history}
    (args.logdir / "run.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    if args.verbose:
        print(f"saved {out} ({timings['ppo_s']:.0f} s of PPO; eval req99 {final.get('req99')}, "
              f"best {cb.best_req99:.3f} at step {cb.best_step}, best model "
              f"{args.logdir / 'best_model.zip'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
