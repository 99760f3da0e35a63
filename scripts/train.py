"""Train a learned scheduler with MaskablePPO on PDCluster-v0 (optionally warm-started by behaviour
cloning HexAgent), logging to TensorBoard.

Usage:
    python scripts/train.py --total-timesteps 1024 --num-workflows 20 --logdir runs/smoke \\
        --out runs/smoke/model.zip
    python scripts/train.py --init-from hexagent --total-timesteps 150000 --logdir runs/hetero1 \\
        --out models/learned_hetero1_bfcl.zip          # the shipped model (docs/learned.md)
    python scripts/train.py --mixture bfcl-mix --init-from hexagent-search ...  # expert
        # iteration on a distribution of clusters (docs/learned.md has the full command)
    tensorboard --logdir runs

Episodes: the experiment config (--config, a YAML path or a configs/experiments name; only its
episode keys apply) over the training defaults below, then the flags. Sub-env i starts from the
config seed + i, so the envs sample different episodes. Evaluation episodes use seeds
--eval-seeds on the same config (or --eval-num-workflows); --baselines names policies to
evaluate once on them as references. Outputs in --logdir: TensorBoard events (eval/req99,
hexagent/req99, baseline/<name>/req99, train/*, rollout/*, bc/*), progress.csv, best_model.zip
(lowest eval/req99), run.json (arguments, timings, final numbers). The final model goes to --out.
The pipeline itself is hexagent_gym.agents.training.train; this script turns the flags into its
TrainConfig.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hexagent_gym.agents.training import (
    CHOICES,
    TRAIN_DEFAULTS,
    TrainConfig,
    TrainConfigError,
    train,
)
from hexagent_gym.config import ConfigError

D = TrainConfig()  # the defaults of every flag


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}"
                                         ) from None


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _load(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--load is the offered prefill load (a number), got {text!r}; to continue from a "
            f"saved model use --load-model {text}") from None


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """The TrainConfig of a command line (exits with a usage error naming an invalid flag)."""
    # prog named so that scripts/tune.py, which parses its trials' flags here, shows train.py's
    p = argparse.ArgumentParser(prog="train.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    env = p.add_argument_group("episodes")
    env.add_argument("--config", help="experiment YAML path or shipped name; its episode keys "
                     "override the training defaults")
    env.add_argument("--mixture", help="train on a distribution: a configs/mixtures name or "
                     "YAML path; each training and teacher episode draws a setting from it, the "
                     "episode flags below then set only the evaluation episodes")
    env.add_argument("--cluster", help=f"cluster (default {TRAIN_DEFAULTS['cluster']})")
    env.add_argument("--trace", help=f"trace (default {TRAIN_DEFAULTS['trace']})")
    env.add_argument("--num-workflows", type=int,
                     help=f"workflows per episode (default {TRAIN_DEFAULTS['num_workflows']})")
    env.add_argument("--load", type=_load,
                     help=f"offered prefill load ρ, as in scripts/evaluate.py (default "
                     f"{TRAIN_DEFAULTS['load']}); --load-model continues from a saved model")
    env.add_argument("--p-max", type=int, help="pad prefill slots (for --policy mlp transfer)")
    env.add_argument("--d-max", type=int, help="pad decode slots (for --policy mlp transfer)")
    env.add_argument("--reward", default=D.reward, help="env reward name (envs/rewards.py)")
    env.add_argument("--target-alpha", type=float, help="α of the reward (env default 1.5)")
    env.add_argument("--terminal-weight", type=float,
                     help="weight of the tail reward's terminal −(Req99 − 1) term (default 1)")
    env.add_argument("--relative-to", choices=CHOICES["relative_to"], default=D.relative_to,
                     help="train on the reward relative to this policy on the same episode "
                     "(agents/shaping.py)")
    env.add_argument("--n-envs", type=int, default=D.n_envs, help="parallel training envs")
    env.add_argument("--vec", choices=CHOICES["vec"], default=D.vec,
                     help="DummyVecEnv (one process) or SubprocVecEnv")
    algo = p.add_argument_group("model")
    algo.add_argument("--policy", choices=CHOICES["policy"], default=D.policy)
    algo.add_argument("--load-model", type=Path,
                      help="continue training this saved model (.zip)")
    algo.add_argument("--init-from", choices=CHOICES["init_from"], default=D.init_from,
                      help="behaviour-clone this teacher before PPO: HexAgent, HexAgent with "
                      "a one-step lookahead over its pick order (agents/lookahead.py), or "
                      "HexAgent with rollout search (agents/search.py; expert iteration)")
    algo.add_argument("--total-timesteps", type=int, default=D.total_timesteps)
    algo.add_argument("--lr", type=float, default=D.lr, help="PPO learning rate")
    algo.add_argument("--n-steps", type=int, default=D.n_steps, help="rollout steps per env")
    algo.add_argument("--batch-size", type=int, default=D.batch_size)
    algo.add_argument("--n-epochs", type=int, default=D.n_epochs)
    algo.add_argument("--gamma", type=float, default=D.gamma)
    algo.add_argument("--gae-lambda", type=float, default=D.gae_lambda)
    algo.add_argument("--clip-range", type=float, default=D.clip_range)
    algo.add_argument("--ent-coef", type=float, default=D.ent_coef)
    algo.add_argument("--hidden", type=int, default=D.hidden, help="equivariant embedding width")
    algo.add_argument("--cache-feature", action="store_true",
                      help="the equivariant network also reads each call's prefix-cache "
                      "affinity per prefill instance (obs['cached'])")
    algo.add_argument("--prior", type=float, default=D.prior,
                      help="initial weight of the equivariant policy's HexAgent indicators")
    bc = p.add_argument_group("behaviour cloning (--init-from)")
    bc.add_argument("--bc-episodes", type=int, default=D.bc_episodes,
                    help="teacher episodes to imitate")
    bc.add_argument("--bc-epochs", type=int, default=D.bc_epochs)
    bc.add_argument("--bc-lr", type=float, default=D.bc_lr)
    bc.add_argument("--bc-value-coef", type=float, default=D.bc_value_coef,
                    help="weight of the critic's regression on returns (0: actor only)")
    bc.add_argument("--dagger-rounds", type=int, default=D.dagger_rounds,
                    help="DAgger rounds after cloning (learner's greedy states, teacher labels)")
    bc.add_argument("--dagger-episodes", type=int, default=D.dagger_episodes,
                    help="episodes per DAgger round")
    bc.add_argument("--demos", type=Path, help="cache of the teacher's cloning episodes "
                    "(.npz): read if it exists and matches, else collected and written (a "
                    "hexagent-search teacher takes about a minute per episode)")
    bc.add_argument("--bc-target-prob", type=float, default=D.bc_target_prob,
                    help="after cloning, lower the equivariant policy's logit scale until it "
                    "gives the teacher's pick this (geometric-mean) probability, so PPO "
                    "explores; 0 keeps the cloned sharpness")
    ev = p.add_argument_group("evaluation and output")
    ev.add_argument("--eval-every", type=int, default=D.eval_every,
                    help="env steps between evals")
    ev.add_argument("--eval-seeds", type=_ints, default=list(D.eval_seeds),
                    help="comma-separated reset seeds of the evaluation episodes")
    ev.add_argument("--eval-num-workflows", type=int,
                    help="workflows per evaluation episode (default: as training)")
    ev.add_argument("--baselines", type=_names, default=list(D.baselines),
                    help="comma-separated policy names (e.g. random,fcfs) evaluated once on the "
                    "evaluation episodes, printed before the first evaluation and logged next "
                    "to every one as baseline/<name>/req99 etc.")
    ev.add_argument("--seed", type=int, default=D.seed)
    ev.add_argument("--threads", type=int, default=D.threads,
                    help="torch threads (2 cores here)")
    ev.add_argument("--logdir", type=Path, default=D.logdir)
    ev.add_argument("--out", type=Path, help="final model path (default <logdir>/model.zip)")
    ev.add_argument("--verbose", type=int, default=D.verbose,
                    help="0 quiet, 1 eval lines, 2 + SB3 table")
    args = p.parse_args(argv)
    try:
        return TrainConfig(**vars(args))
    except TrainConfigError as exc:
        p.error(f"--{exc.field.replace('_', '-')} {exc.reason}")


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    try:
        result = train(config)
    except ConfigError as exc:  # an invalid episode setting: unknown cluster, trace, reward, ...
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if config.verbose:
        print(result.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
