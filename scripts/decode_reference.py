"""Compare the decode rate model with the per-token reference (docs/simulator.md quotes this).

Usage: python scripts/decode_reference.py [--jobs 200] [--seed 0]
"""

from __future__ import annotations

import argparse

import numpy as np

from hexagent_gym.cluster.latency import LatencyModel
from hexagent_gym.sim.decode_reference import DecodeJob, compare

CASES = [
    ("llama-3.1-70b", "h100", 4), ("llama-3.1-70b", "a100", 4), ("llama-3.1-70b", "h200", 4),
    ("qwen3-235b-a22b", "h200", 4),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    n = args.jobs
    # Poisson arrivals 20/s, prompts 200-6000 tokens, outputs 5-400 tokens (BFCL/ShareGPT-like)
    jobs = [DecodeJob(float(t), int(i), int(o)) for t, i, o in zip(
        np.cumsum(rng.exponential(0.05, n)), rng.integers(200, 6000, n),
        rng.integers(5, 400, n), strict=True)]
    print("| model | GPU x TP | limits | mean rel. error | max rel. error | makespan error |")
    print("|---|---|---|---|---|---|")
    for model, gpu, tp in CASES:
        lm = LatencyModel(model, gpu, tp)
        for label, cap, batch in (("none", 10**9, 256), ("KV 60k tokens, batch 16", 60_000, 16)):
            e = compare(lm, jobs, capacity=cap, max_batch=batch)
            print(f"| {model} | {gpu.upper()} x{tp} | {label} | {e['mean_rel_error']:.2%} | "
                  f"{e['max_rel_error']:.2%} | {e['makespan_rel_error']:.2%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
