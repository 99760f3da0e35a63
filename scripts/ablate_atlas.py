"""Ablation of the ATLAS queue constants (the Autellix paper gives none; docs/agents.md).

Runs in the regime the documented table was measured in: no prefix cache, sample groups served
as separate calls, ATLAS without program-locality routing.

Usage: python scripts/ablate_atlas.py [--trace bfcl_v3] [--cluster hetero-1] [--loads 1.0 1.2]
"""

from __future__ import annotations

import argparse

from agents.baselines import Atlas
from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.policy import run_policy

VARIANTS = [
    ("default: levels 1/4/16 s, beta 4", (1.0, 4.0, 16.0), 4.0),
    ("finer levels 0.5/1/2/4/8 s", (0.5, 1.0, 2.0, 4.0, 8.0), 4.0),
    ("coarser levels 4/32 s", (4.0, 32.0), 4.0),
    ("eager anti-starvation, beta 1", (1.0, 4.0, 16.0), 1.0),
    ("lazy anti-starvation, beta 16", (1.0, 4.0, 16.0), 16.0),
    ("no anti-starvation (beta 1e9)", (1.0, 4.0, 16.0), 1e9),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="bfcl_v3")
    parser.add_argument("--cluster", default="hetero-1")
    parser.add_argument("--num-workflows", type=int, default=400)
    parser.add_argument("--loads", type=float, nargs="+", default=[1.0, 1.2])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    header = " | ".join(f"Req95 / Req99 @ load {x}" for x in args.loads)
    print(f"| ATLAS variant | {header} |")
    print("|---|" + "---|" * len(args.loads))
    factories = [EpisodeFactory(EpisodeConfig(cluster=args.cluster, trace=args.trace,
                                              num_workflows=args.num_workflows, load=x,
                                              prefix_cache=False,
                                              parallel_sampling=False))
                 for x in args.loads]
    for label, thresholds, beta in VARIANTS:
        cells = []
        for factory in factories:
            r95, r99 = [], []
            for seed in args.seeds:
                res = run_policy(factory.simulator(seed), Atlas(thresholds, beta, locality=False))
                r95.append(res.req95)
                r99.append(res.req99)
            cells.append(f"{sum(r95) / len(r95):.2f} / {sum(r99) / len(r99):.2f}")
        print(f"| {label} | " + " | ".join(cells) + " |")
    print(f"\n{args.cluster} / {args.trace}, {args.num_workflows} workflows, mean over seeds "
          f"{args.seeds}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
