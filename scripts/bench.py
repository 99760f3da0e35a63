"""Print the simulator's speed figures (docs/performance.md quotes this script's output).

Usage: python scripts/bench.py [--trace bfcl_v3] [--cluster hetero-1] [--num-workflows 400]
"""

from __future__ import annotations

import argparse

from agents.benchmark import bench_policy
from hexagent_gym.benchmark import bench_core


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="bfcl_v3")
    parser.add_argument("--cluster", default="hetero-1")
    parser.add_argument("--num-workflows", type=int, default=400)
    parser.add_argument("--load", type=float, default=0.8,
                        help="prefill utilisation that sets the arrival rate (default 0.8)")
    parser.add_argument("--policy-load", type=float, default=1.0,
                        help="load of the HexAgent planning-overhead run (default 1.0)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs")
    args = parser.parse_args(argv)
    core = bench_core(args.trace, args.cluster, args.num_workflows, args.load, args.seed,
                      args.repeat)
    print(f"core (fallback policy) on {core.cluster} / {core.trace}: {core.num_workflows} "
          f"workflows, {core.num_calls} calls, {core.arrival_rate:.2f} workflows/s "
          f"(load {args.load})")
    print(f"  us per simulated call: {core.us_per_call:.1f} (horizons cached), "
          f"{core.us_per_call_cold:.1f} (including standalone horizons); budget 50")
    print(f"  fallback Req99: {core.req99:.3f}")
    pol = bench_policy("hexagent", args.trace, args.cluster, args.num_workflows,
                       args.policy_load, args.seed)
    print(f"hexagent planning on {args.cluster} / {args.trace} at load {args.policy_load}: "
          f"{pol.invocations} invocations, {pol.mean_window:.1f} calls per invocation")
    print(f"  ms per invocation: mean {pol.ms_mean:.3f}, median {pol.ms_median:.3f}, "
          f"p99 {pol.ms_p99:.3f}; total {pol.scheduler_seconds:.2f} s; budget 0.5 ms; "
          f"Req99 {pol.req99:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
