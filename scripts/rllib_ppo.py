"""PPO with invalid-action masking on PDCluster-v0 through RLlib's new API stack.

Usage:
    python scripts/rllib_ppo.py --iterations 5 --num-workflows 20 --logdir runs
    tensorboard --logdir runs
    python scripts/rllib_ppo.py --cluster tiny-2p2d --num-workflows 6 --iterations 1 \\
        --train-batch-size 64 --minibatch-size 32          # a quick check (~15 s)

The config is hexagent_gym.agents.rllib_env.ppo_config: the env is the RLlib shape of PDCluster-v0
(``{"action_mask", "observations"}``, built on ``action_mask_in_obs=True``) and the RLModule is
hexagent_gym.agents.rllib_module.MaskedPPOTorchRLModule (RLlib's public DefaultPPOTorchRLModule
with invalid actions' logits set to FLOAT_MIN, so they get no probability). Each iteration prints
the env runners' mean episode return and Req99 (logged by
hexagent_gym.agents.rllib_env.log_episode_metrics from the final step's info) and writes them,
with PPO's losses, to TensorBoard (<logdir>/<run>: charts/*, losses/*; step = env steps sampled
so far; hexagent_gym.agents.rllib_env.result_scalars).
Needs ``ray[rllib]`` (``pip install "hexagent-gym[distributed]"``); Ray starts locally with
--num-cpus CPUs.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from hexagent_gym.agents.rllib_env import ppo_config, result_scalars, result_step


def summary(result: dict[str, Any]) -> str:
    """One line from an ``Algorithm.train()`` result: steps, mean return, Req99, policy loss."""
    runners = result.get("env_runners", {})
    learner = result.get("learners", {}).get("default_policy", {})
    parts = [f"iter {result.get('training_iteration')}"]
    for label, value in (("env steps", runners.get("num_env_steps_sampled_lifetime")),
                         ("episodes", runners.get("num_episodes_lifetime")),
                         ("return", runners.get("episode_return_mean")),
                         ("req99", runners.get("req99")),
                         ("policy loss", learner.get("policy_loss"))):
        if value is not None:  # counts arrive as floats from RLlib's metrics
            parts.append(f"{label} {value:.4g}")
    return ", ".join(parts)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--cluster", default="hetero-1")
    p.add_argument("--trace", default="bfcl_v3")
    p.add_argument("--num-workflows", type=int, default=20)
    p.add_argument("--max-calls-per-decision", type=int, default=16, help="K")
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--train-batch-size", type=int, default=512)
    p.add_argument("--minibatch-size", type=int, default=128)
    p.add_argument("--num-epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--hidden", type=int, default=128, help="width of the MLP layers")
    p.add_argument("--num-env-runners", type=int, default=0)
    p.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray instance")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--logdir", default="runs", help="TensorBoard runs folder ('' for none)")
    return p.parse_args(argv)


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Build the PPO algorithm, run ``args.iterations`` iterations (printing :func:`summary`
    and writing :func:`result_scalars` to TensorBoard at :func:`result_step`) and return
    ``{"results": [train() results], "run_dir": TensorBoard folder or None}``. Starts a local
    Ray with ``args.num_cpus`` CPUs and shuts it down, unless Ray is already initialized."""
    import ray

    env_config = {"cluster": args.cluster, "trace": args.trace, "seed": args.seed,
                  "num_workflows": args.num_workflows,
                  "max_calls_per_decision": args.max_calls_per_decision}
    config = ppo_config(env_config, train_batch_size=args.train_batch_size,
                        minibatch_size=args.minibatch_size, num_epochs=args.num_epochs,
                        lr=args.lr, num_env_runners=args.num_env_runners, hidden=args.hidden,
                        seed=args.seed)
    run_dir, writer = None, None
    if args.logdir:
        from torch.utils.tensorboard import SummaryWriter

        run_dir = f"{args.logdir}/rllib_ppo__{args.cluster}__{args.seed}__{int(time.time())}"
        writer = SummaryWriter(run_dir)
        writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(
            f"|{k}|{v}|" for k, v in vars(args).items()))
    own_ray = not ray.is_initialized()
    if own_ray:
        ray.init(num_cpus=args.num_cpus, include_dashboard=False, logging_level="warning")
    results = []
    try:
        algo = config.build_algo()
        try:
            for _ in range(args.iterations):
                result = algo.train()
                results.append(result)
                print(summary(result), flush=True)
                if writer is not None:
                    step = result_step(result)
                    for tag, value in result_scalars(result).items():
                        writer.add_scalar(tag, value, step)
                    writer.flush()  # one iteration can take minutes: show it as it comes
        finally:
            algo.stop()
    finally:
        if writer is not None:
            writer.close()
        if own_ray:
            ray.shutdown()
    return {"results": results, "run_dir": run_dir}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import ray  # noqa: F401
        import ray.rllib  # noqa: F401 -- ray[tune] alone lacks RLlib's dependencies
    except ImportError as exc:
        print(f'error: needs ray[rllib] ({exc}): pip install "hexagent-gym[distributed]"',
              file=sys.stderr)
        return 2
    train(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
