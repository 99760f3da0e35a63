"""PPO with invalid-action masking on PDCluster-v0 through RLlib's new API stack.

Usage:
    python scripts/rllib_ppo.py --iterations 5 --num-workflows 20
    python scripts/rllib_ppo.py --cluster tiny-2p2d --num-workflows 6 --iterations 1 \\
        --train-batch-size 64 --minibatch-size 32          # a quick check (~15 s)

The config is hexagent_gym.agents.rllib_env.ppo_config: the env is the RLlib shape of PDCluster-v0
(``{"action_mask", "observations"}``, built on ``action_mask_in_obs=True``) and the RLModule is
RLlib's example ``ActionMaskingTorchRLModule``, which adds log(mask) to PPO's logits so invalid
actions get no probability. Each iteration prints the env runners' mean episode return and
Req99 (logged by hexagent_gym.agents.rllib_env.log_episode_metrics from the final step's info).
Needs ``ray[rllib]`` (``pip install "hexagent-gym[distributed]"``); Ray starts locally with
--num-cpus CPUs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hexagent_gym.agents.rllib_env import ppo_config


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


def main(argv: list[str] | None = None) -> int:
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
    args = p.parse_args(argv)
    try:
        import ray
        import ray.rllib  # noqa: F401 -- ray[tune] alone lacks RLlib's dependencies
    except ImportError as exc:
        print(f'error: needs ray[rllib] ({exc}): pip install "hexagent-gym[distributed]"',
              file=sys.stderr)
        return 2

    env_config = {"cluster": args.cluster, "trace": args.trace, "seed": args.seed,
                  "num_workflows": args.num_workflows,
                  "max_calls_per_decision": args.max_calls_per_decision}
    config = ppo_config(env_config, train_batch_size=args.train_batch_size,
                        minibatch_size=args.minibatch_size, num_epochs=args.num_epochs,
                        lr=args.lr, num_env_runners=args.num_env_runners, hidden=args.hidden,
                        seed=args.seed)
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, logging_level="warning")
    try:
        algo = config.build_algo()
        for _ in range(args.iterations):
            print(summary(algo.train()), flush=True)
        algo.stop()
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
