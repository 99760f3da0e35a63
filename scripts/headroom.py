"""Print a paired Req99 table from an evaluated grid's ``cells.jsonl``: the headroom table and
the learned schedulers' held-out table of docs/learned.md.

For each (cluster, trace): Req99 of the reference (default hexagent), of each compared policy
(default hexagent-search and hexagent-search-oracle) and of the best baseline (lowest mean Req99
among the other policies), each as mean ± 95 % CI over seeds, then the paired reductions
``1 − Req99(policy) / Req99(reference)`` per seed (mean ± CI; positive means the policy's
schedule beat the reference). Policies go by their grid label when they have one.

    python scripts/evaluate.py headroom --workers 2        # writes results/headroom/cells.jsonl
    python scripts/headroom.py results/headroom/cells.jsonl
    python scripts/headroom.py results/expert_iteration/cells.jsonl \\
        --policies search-mix-s0,search-mix-s1,search-mix-s2,learned
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from hexagent_gym.experiments.cell_log import read_cells
from hexagent_gym.experiments.cells import policy_label
from hexagent_gym.experiments.stats import Stat

REFERENCE = "hexagent"
SEARCHES = ("hexagent-search", "hexagent-search-oracle")


def headroom_rows(cells: dict[str, dict], reference: str = REFERENCE,
                  policies: tuple[str, ...] = SEARCHES) -> list[str]:
    """Markdown table lines for every (cluster, trace) with a ``reference`` cell, in grid
    order; a compared policy without cells in a row shows "not run"."""
    req99: dict[tuple[str, str], dict[str, dict[int, float]]] = defaultdict(
        lambda: defaultdict(dict))
    for record in cells.values():
        cell = record["cell"]
        ep = cell["episode"]
        req99[(ep["cluster"], ep["trace"])][policy_label(cell)][ep["seed"]] = \
            record["metrics"]["req99"]
    head = (f"| cluster | trace | {reference} | " + " | ".join(policies) + " | best baseline | "
            + " | ".join(f"{p} vs {reference}" for p in policies) + " |")
    lines = [head, "|" + "---|" * (4 + 2 * len(policies))]
    for (cluster, trace), by_policy in req99.items():
        ref = by_policy.get(reference)
        if not ref:
            continue
        others = {p: v for p, v in by_policy.items() if p != reference and p not in policies}
        best = min(others, key=lambda p: Stat.of(list(others[p].values())).mean, default=None)
        cols = [Stat.of(list(ref.values())).format(3)]
        for name in policies:
            seeds = by_policy.get(name, {})
            cols.append(Stat.of(list(seeds.values())).format(3) if seeds else "not run")
        cols.append(f"{best} {Stat.of(list(others[best].values())).format(3)}" if best else "–")
        for name in policies:
            seeds = by_policy.get(name, {})
            paired = [100 * (1 - seeds[s] / ref[s]) for s in sorted(seeds) if s in ref]
            cols.append(f"{Stat.of(paired).format(1)} %" if paired else "–")
        lines.append(f"| {cluster} | {trace} | " + " | ".join(cols) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", type=Path, help="cells.jsonl of an evaluated grid")
    parser.add_argument("--reference", default=REFERENCE,
                        help=f"policy (or label) the others are paired against (default "
                        f"{REFERENCE})")
    parser.add_argument("--policies", default=",".join(SEARCHES),
                        help="comma-separated policies (or labels) to pair against the "
                        f"reference (default {','.join(SEARCHES)})")
    args = parser.parse_args(argv)
    if not args.cells.is_file():
        parser.error(f"{args.cells}: no such file (run scripts/evaluate.py on the grid first)")
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    if not policies:
        parser.error("--policies names no policy")
    lines = headroom_rows(read_cells(args.cells), args.reference, policies)
    if len(lines) == 2:
        print(f"{args.cells}: no cell of policy '{args.reference}' yet", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
