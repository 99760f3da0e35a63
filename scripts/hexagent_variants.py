"""Is HexAgent a local optimum of its own rule? Paired Req99 of one-knob variants against it.

HexAgent ranks waiting calls by R(c) = ((t − a_w) + min Δ) / H_w. Each variant changes one knob
of that rank, places like HexAgent (the argmin pair) and is rolled out on the same episodes:

* ``elapsed=w``: R = (w·(t − a_w) + min Δ) / H_w (w = 1 is HexAgent);
* ``horizon=β``: R = ((t − a_w) + min Δ) / H_w^β (β = 1 is HexAgent);
* ``tie=ε``: among calls whose risk is within ε·|max R| of the largest, the shortest min Δ.

Episodes are drawn from a mixture (``--mixture``, as ``scripts/train.py`` trains on) or are
one setting's (``--cluster/--trace/--arrival-rate``). Prints, per variant, the paired reduction
``1 − Req99(variant) / Req99(hexagent)`` (mean ± 95 % CI over episodes; positive: the variant
beat HexAgent) and how many episodes it won. docs/learned.md reads it:

    python scripts/hexagent_variants.py --mixture bfcl-mix --episodes 100
    python scripts/hexagent_variants.py --cluster asym-2p8d --trace bfcl_v3 --arrival-rate 40 \\
        --episodes 30
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from hexagent_gym.agents.hexagent import HexAgentPolicy, projected_risk
from hexagent_gym.envs.mixture import MixtureEnv
from hexagent_gym.envs.pd_cluster_env import PDClusterEnv
from hexagent_gym.experiments.stats import Stat

DEFAULT_VARIANTS = ("elapsed=0.7", "elapsed=1.5", "elapsed=2", "horizon=0.8", "horizon=1.2",
                    "horizon=1.5", "tie=0.05", "tie=0.15")
KNOBS = ("elapsed", "horizon", "tie")


class RiskVariant(HexAgentPolicy):
    """HexAgent with one knob of its risk rank changed (see the module docstring); with the
    defaults it picks exactly as HexAgent (below the one-pass threshold)."""

    def __init__(self, elapsed: float = 1.0, horizon: float = 1.0, tie: float = 0.0) -> None:
        super().__init__()
        self.elapsed, self.horizon, self.tie = float(elapsed), float(horizon), float(tie)
        self.name = f"hexagent[elapsed={elapsed:g},horizon={horizon:g},tie={tie:g}]"

    def pick(self, dp) -> tuple[int, int, int]:
        if len(dp.calls) == 1:
            slot = 0
        else:
            best = dp.min_delta
            if self.elapsed == 1.0 and self.horizon == 1.0:
                risk = projected_risk(dp, best)
            else:
                batch = dp.batch
                risk = ((self.elapsed * (dp.now - batch.arrival) + best)
                        / batch.h_est ** self.horizon)
                risk[np.asarray(dp.picked)] = -np.inf
            top = risk.max()
            if self.tie > 0.0:
                near = np.flatnonzero(risk >= top - self.tie * abs(top))
                slot = int(near[np.argmin(best[near])])
            else:
                slot = int(np.argmax(risk))
        p, d, _ = dp.best_pair(slot)
        return slot, p, d


def parse_variant(text: str) -> RiskVariant:
    """``knob=value`` → :class:`RiskVariant`.

    Raises:
        ValueError: naming the text and the valid knobs.
    """
    knob, sep, value = text.partition("=")
    if not sep or knob not in KNOBS:
        raise ValueError(f"variant {text!r}: expected knob=value with knob one of "
                         f"{', '.join(KNOBS)} (e.g. elapsed=1.5)")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"variant {text!r}: {value!r} is not a number") from None
    if knob == "tie" and number < 0.0:
        raise ValueError(f"variant {text!r}: tie must be >= 0")
    return RiskVariant(**{knob: number})


def compare(env, variants: list[str], seeds: list[int]) -> list[tuple[str, Stat, int]]:
    """(variant, paired Req99 reduction in % vs HexAgent, episodes won) per variant."""
    ref = [env.rollout("hexagent", seed=s).episode.req99 for s in seeds]
    rows = []
    for text in variants:
        policy = parse_variant(text)
        req99 = [env.rollout(policy, seed=s).episode.req99 for s in seeds]
        paired = [100.0 * (1.0 - v / r) for v, r in zip(req99, ref, strict=True)]
        rows.append((text, Stat.of(paired), sum(v < r for v, r in zip(req99, ref, strict=True))))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mixture", help="draw episodes from this mixture (configs/mixtures)")
    parser.add_argument("--cluster", default="hetero-1")
    parser.add_argument("--trace", default="bfcl_v3")
    parser.add_argument("--arrival-rate", type=float, default=40.0)
    parser.add_argument("--num-workflows", type=int, default=50)
    parser.add_argument("--episodes", type=int, default=30, help="paired episodes (seeds 0..N-1)")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help="comma-separated knob=value (knobs: elapsed, horizon, tie)")
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    try:
        for text in variants:
            parse_variant(text)
    except ValueError as err:
        parser.error(str(err))
    if args.episodes < 2:
        parser.error(f"--episodes must be >= 2 for a confidence interval, got {args.episodes}")
    if args.mixture:
        env = MixtureEnv(args.mixture, num_workflows=args.num_workflows)
        where = f"mixture {args.mixture}"
    else:
        env = PDClusterEnv(cluster=args.cluster, trace=args.trace, load=None,
                           arrival_rate=args.arrival_rate, num_workflows=args.num_workflows)
        where = f"{args.cluster} / {args.trace} at {args.arrival_rate:g} workflows/s"
    rows = compare(env, variants, list(range(args.episodes)))
    print(f"{where}, {args.num_workflows} workflows, {args.episodes} paired episodes; "
          "Req99 reduction vs hexagent (positive: the variant is better)")
    print("| variant | reduction | episodes won |")
    print("|---|---|---|")
    for text, stat, won in rows:
        print(f"| {text} | {stat.format(2)} % | {won}/{args.episodes} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
