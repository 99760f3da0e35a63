"""Print the simulator's speed figures and, with --ci, the small-trace quality check.

Usage:
    python scripts/bench.py                        # speed figures (docs/performance.md)
    python scripts/bench.py --no-scaling --no-ppo  # without the two slowest parts
    python scripts/bench.py --ci                   # + every policy on small fixed traces;
                                                   #   exit 1 if HexAgent's Req99 regressed
    python scripts/bench.py --ci --update-baseline # rewrite .ci/baseline.json
    python scripts/bench.py --only-overload        # just the overload table (docs/overload.md)
    python scripts/bench.py --only-horizon         # just the forecast's cost (docs/horizons.md)
    python scripts/bench.py --only-horizon --horizon-workflows 2000 --horizon-repeat 3
Performance figures are printed, never asserted (CI machines are noisy).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path

import numpy as np

from hexagent_gym.agents.benchmark import bench_horizon, bench_policy, bench_ppo
from hexagent_gym.agents.regression import (
    check,
    format_table,
    load_baseline,
    run_ci_cases,
    save_baseline,
)
from hexagent_gym.experiments.benchmark import bench_core, bench_timeline
from hexagent_gym.experiments.overload_bench import (
    FLAT_GOAL,
    OVERLOAD_DEPTH,
    OVERLOAD_SIZES,
    bench_overload,
    flat_ratio,
    over_goal,
)
from hexagent_gym.policy import policy_names

BASELINE = Path(__file__).resolve().parent.parent / ".ci" / "baseline.json"
# the scaling table's row pairs whose ratios the goals name (indices into SCALING_ROWS):
# 64P+64D over 8P+8D, and 10,000 over 400 workflows
_PAIRS = ((3, 0), (4, 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="bfcl_v3")
    parser.add_argument("--cluster", default="hetero-1")
    parser.add_argument("--num-workflows", type=int, default=400)
    parser.add_argument("--load", type=float, default=0.8,
                        help="prefill utilisation of the core speed run (default 0.8)")
    parser.add_argument("--policy-load", type=float, default=1.0,
                        help="load of the HexAgent planning-overhead run (default 1.0)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs")
    parser.add_argument("--ci", action="store_true", help="also run the small-trace check")
    parser.add_argument("--no-scaling", action="store_true",
                        help="skip the scaling table (whole rollouts up to 64P+64D, ~1 min)")
    parser.add_argument("--no-ppo", action="store_true",
                        help="skip PPO training throughput (MaskablePPO learn() fps, ~25 s)")
    parser.add_argument("--no-horizon", action="store_true",
                        help="skip the horizon-forecast overhead (two warm-started runs, ~30 s)")
    parser.add_argument("--no-overload", action="store_true",
                        help="skip the overload table (every policy at 500 / 2,000 / 5,000 "
                        "workflows at 40/s, plan_depth 32: several minutes; with --ci it is cut "
                        "to fcfs and hexagent at 500 / 2,000, about 20 s)")
    parser.add_argument("--only-overload", action="store_true",
                        help="print only the overload table")
    parser.add_argument("--only-horizon", action="store_true",
                        help="print only the horizon-forecast overhead")
    parser.add_argument("--horizon-repeat", type=int, default=16,
                        help="best of N rollouts each way for the horizon-forecast share: it is "
                             "a 20-30 ms difference between two 0.3 s rollouts, within this "
                             "machine's noise at N=3 (~10 s at 400 workflows)")
    parser.add_argument("--horizon-workflows", default=None,
                        help="comma-separated episode lengths of the horizon-forecast overhead "
                        "(default: --num-workflows)")
    parser.add_argument("--overload-policies", default=None,
                        help="comma-separated policies of the overload table (default: every "
                        "registered one; with --ci fcfs,hexagent)")
    parser.add_argument("--overload-sizes", default=None,
                        help="comma-separated episode lengths of the overload table (default "
                        "500,2000,5000; with --ci 500,2000)")
    parser.add_argument("--plan-depth", type=int, default=OVERLOAD_DEPTH,
                        help=f"plan_depth of the overload table (default {OVERLOAD_DEPTH}; 0: "
                        "none, the exact rule whose cost grows with the queue)")
    parser.add_argument("--update-baseline", action="store_true")
    parser.add_argument("--tolerance", type=float, default=0.02,
                        help="allowed relative rise of HexAgent's Req99 (default 0.02)")
    args = parser.parse_args(argv)
    if args.only_overload:
        print_overload(args)
        return 0
    if args.only_horizon:
        print_horizon(args)
        return 0

    off = None
    for cache in (False, True):
        core = bench_core(args.trace, args.cluster, args.num_workflows, args.load, args.seed,
                          args.repeat, prefix_cache=cache)
        if not cache:
            print(f"core (fallback policy) on {core.cluster} / {core.trace}: "
                  f"{core.num_workflows} workflows, {core.num_calls} calls, "
                  f"{core.arrival_rate:.2f} workflows/s (load {args.load} without the cache)")
            off = core
        ratio = f"; {core.us_per_call / off.us_per_call:.2f}x of off" if cache else ""
        print(f"  prefix cache {'on ' if cache else 'off'} (hit rate {core.prefix_hit_rate:.2f}):"
              f" us per simulated call {core.us_per_call:.1f} (horizons cached), "
              f"{core.us_per_call_cold:.1f} (including standalone horizons){ratio}")
    pol = bench_policy("hexagent", args.trace, args.cluster, args.num_workflows,
                       args.policy_load, args.seed)
    print(f"hexagent planning on {args.cluster} / {args.trace} at load {args.policy_load}: "
          f"{pol.invocations} invocations, {pol.mean_window:.1f} calls per invocation")
    print(f"  ms per invocation: mean {pol.ms_mean:.3f}, median {pol.ms_median:.3f}, "
          f"p99 {pol.ms_p99:.3f}; total {pol.scheduler_seconds:.2f} s; budget 0.5 ms; "
          f"Req99 {pol.req99:.3f}")
    if not args.no_horizon:
        print_horizon(args)
    tl = bench_timeline("hexagent", args.trace, args.cluster, args.num_workflows, args.load,
                        args.seed, args.repeat)
    print(f"timeline recording (hexagent rollout on {args.cluster} / {args.trace}, load "
          f"{args.load}, {tl.num_calls} calls): us per simulated call {tl.us_per_call_off:.1f} "
          f"off, {tl.us_per_call_on:.1f} on ({tl.overhead_pct:+.1f} %); {tl.spans} spans, "
          f"Chrome trace export {tl.export_ms:.0f} ms")
    if importlib.util.find_spec("hexagent_gym.envs.benchmark") is not None:
        from hexagent_gym.envs.benchmark import bench_env

        for label, serving in (("prefix cache on", {}),
                               ("prefix cache off", {"prefix_cache": False,
                                                     "parallel_sampling": False})):
            env = bench_env(cluster=args.cluster, trace=args.trace,
                            num_workflows=args.num_workflows, repeat=args.repeat, **serving)
            print(f"env steps/s (random valid actions, K={env.k}) on {args.cluster} / "
                  f"{args.trace}, {label}: {env.steps_per_s:.0f} ({env.us_per_step:.1f} "
                  f"us/step, {env.picks_per_decision:.2f} picks per decision point, garbage "
                  f"collector {100 * env.gc_share:.1f} % of the timed runs); "
                  f"CartPole-v1 in the same run: {env.cartpole_steps_per_s:.0f} "
                  f"(ratio {env.steps_per_s / env.cartpole_steps_per_s:.2f})")
        if not args.no_ppo:
            ppo = bench_ppo(args.cluster, args.trace, repeat=args.repeat, seed=args.seed)
            cart = ppo.run("cartpole")
            print(f"PPO training fps (learn(), {ppo.n_envs} envs x n_steps {ppo.n_steps}, "
                  f"{cart.timesteps} steps timed, 1 torch thread) on {args.cluster} / "
                  f"{args.trace}, {ppo.num_workflows} workflows; CartPole-v1 PPO in the same "
                  f"run: {cart.fps:.0f}")
            print("  " + "; ".join(
                f"{name} {r.fps:.0f} ({ppo.ratio(r.label):.2f}x CartPole; rollout "
                f"{r.rollout_seconds:.2f} s + update {r.update_seconds:.2f} s)"
                for name, r in (("equivariant", ppo.run("equivariant")),
                                ("MultiInput", ppo.run("mlp")))))
        if not args.no_scaling:
            from hexagent_gym.envs.benchmark import bench_cartpole, bench_scaling, paired_ratios
            from hexagent_gym.planning import kernels

            def yardstick() -> float:  # the machine's speed around the table (best of 3)
                return max(bench_cartpole(20_000, np.random.default_rng(args.seed))
                           for _ in range(3))

            before = yardstick()
            rows = bench_scaling("hexagent", args.trace, args.policy_load, seed=args.seed,
                                 repeat=args.repeat)
            after = yardstick()
            compiled = ("compiled kernels" if kernels.best_prefill_pairs is not None
                        else "pure-Python rules")
            print(f"\nscaling through env.rollout('hexagent') on {args.trace} at load "
                  f"{args.policy_load}, {compiled} (us per simulated call; first rollout "
                  "includes the standalone horizons; again: fastest sample of `laps` rollouts "
                  "back to back, about as many calls per sample in every row; gc: the garbage "
                  "collector's part of `again`):")
            print(f"  {'cluster':<12} {'size':>9} {'workflows':>9} {'calls':>7} "
                  f"{'first':>7} {'again':>7} {'gc':>5} {'laps':>4} {'ms/inv':>7} "
                  f"{'picks/call':>10} {'Req99':>6}")
            for r in rows:
                print(f"  {r.cluster:<12} {r.instances:>9} {r.num_workflows:>9} "
                      f"{r.num_calls:>7} {r.us_per_call_first:>7.1f} {r.us_per_call:>7.1f} "
                      f"{r.gc_us_per_call:>5.1f} {r.laps:>4} {r.ms_per_invocation:>7.3f} "
                      f"{r.picks_per_call:>10.2f} {r.req99:>6.3f}")
            print(f"  CartPole-v1 steps/s just before and after the table: {before:.0f}, "
                  f"{after:.0f} (this machine's speed then; compare rows within one table)")
            pairs = []
            for i, j in _PAIRS:
                if max(i, j) >= len(rows):
                    continue
                rounds = paired_ratios(rows[i], rows[j])
                pairs.append(
                    f"{rows[i].instances}/{rows[i].num_workflows} ÷ {rows[j].instances}/"
                    f"{rows[j].num_workflows}: {rows[i].us_per_call / rows[j].us_per_call:.2f}x "
                    "of the fastest samples, per round " + ", ".join(f"{r:.2f}" for r in rounds)
                    + f" (median {statistics.median(rounds):.2f}x)")
            print("  " + "; ".join(pairs))

    if not args.no_overload:
        print_overload(args)
    if not args.ci:
        return 0
    results = run_ci_cases(seed=args.seed)
    print(f"\nsmall-trace check (seed {args.seed}):")
    print(format_table(results))
    if args.update_baseline:
        save_baseline(BASELINE, results)
        print(f"baseline written to {BASELINE}")
        return 0
    problems = check(results, load_baseline(BASELINE), args.tolerance)
    for p in problems:
        print(f"FAIL: {p}", file=sys.stderr)
    print("quality check: " + ("FAILED" if problems else "ok"))
    return 1 if problems else 0


def print_horizon(args: argparse.Namespace) -> None:
    """The horizon forecast's share of a HexAgent rollout at the paper's loaded rate, one line
    per episode length (docs/horizons.md)."""
    sizes = ([int(x) for x in args.horizon_workflows.split(",")] if args.horizon_workflows
             else [args.num_workflows])
    for n in sizes:
        hz = bench_horizon("learned", args.cluster, args.trace, n, seed=args.seed,
                           repeat=args.horizon_repeat)
        print(f"horizon forecasts ({hz.predictor}, warm-started) in a hexagent rollout on "
              f"{args.cluster} / {args.trace}, {n} workflows at 40/s "
              f"({hz.num_calls} calls): {hz.seconds_without:.2f} s without, "
              f"{hz.seconds_with:.2f} s with ({hz.overhead_pct:+.1f} %; budget +10 %); warm "
              f"start {hz.warm_start_seconds:.1f} s once per setting; Req99 hexagent "
              f"{hz.req99_hexagent:.3f}, hexagent-horizon {hz.req99_horizon:.3f}")


def print_overload(args: argparse.Namespace) -> None:
    """The overload table: wall time per simulated call as the queue grows, each policy's
    ratio longest / shortest episode and the policies over the goal (docs/overload.md)."""
    small = args.ci and not args.only_overload
    if args.overload_policies:
        policies = args.overload_policies.split(",")
    elif small:
        policies = ["fcfs", "hexagent"]
    else:
        policies = policy_names()
    sizes = ([int(x) for x in args.overload_sizes.split(",")] if args.overload_sizes
             else [500, 2000] if small else list(OVERLOAD_SIZES))
    depth = args.plan_depth or None
    rows = bench_overload(policies, sizes, args.cluster, args.trace, 40.0, depth,
                          seed=args.seed, repeat=1 if small else args.repeat)
    print(f"\noverload: {args.cluster} / {args.trace} at 40 workflows/s, plan_depth {depth} "
          f"(us per simulated call, fastest of {1 if small else args.repeat} runs):")
    print(f"  {'policy':<24} {'workflows':>9} {'calls':>7} {'seconds':>8} {'us/call':>8} "
          f"{'picks/call':>10} {'Req99':>7}")
    for r in rows:
        print(f"  {r.policy:<24} {r.num_workflows:>9} {r.num_calls:>7} {r.seconds:>8.2f} "
              f"{r.us_per_call:>8.1f} {r.picks_per_call:>10.1f} {r.req99:>7.3f}")
    if len(set(sizes)) > 1:
        over = dict(over_goal(rows, FLAT_GOAL))
        print(f"  us/call ratio {max(sizes)} / {min(sizes)} workflows (goal <= {FLAT_GOAL}): "
              + ", ".join(f"{p} {flat_ratio(rows, p):.2f}x" + (" OVER" if p in over else "")
                          for p in policies))
        print("  over the goal: " + (", ".join(f"{p} ({x:.2f}x)" for p, x in over.items())
                                     if over else "none"))


if __name__ == "__main__":
    raise SystemExit(main())
