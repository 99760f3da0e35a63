"""Print the headroom table (docs/learned.md) from an evaluated grid's ``cells.jsonl``.

For each (cluster, trace): Req99 of hexagent, hexagent-search, hexagent-search-oracle and the
best baseline (lowest mean Req99 among the other policies), each as mean ± 95 % CI over seeds,
then the paired reductions ``1 − Req99(search) / Req99(hexagent)`` per seed (mean ± CI; positive
means the search found a better schedule than HexAgent).

    python scripts/evaluate.py headroom --workers 2        # writes results/headroom/cells.jsonl
    python scripts/headroom.py results/headroom/cells.jsonl
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from hexagent_gym.experiments.cell_log import read_cells
from hexagent_gym.experiments.stats import Stat

REFERENCE = "hexagent"
SEARCHES = ("hexagent-search", "hexagent-search-oracle")


def headroom_rows(cells: dict[str, dict]) -> list[str]:
    """Markdown table lines for every (cluster, trace) with a hexagent cell, in grid order."""
    req99: dict[tuple[str, str], dict[str, dict[int, float]]] = defaultdict(
        lambda: defaultdict(dict))
    for record in cells.values():
        cell = record["cell"]
        ep = cell["episode"]
        req99[(ep["cluster"], ep["trace"])][cell["policy"]][ep["seed"]] = \
            record["metrics"]["req99"]
    head = ("| cluster | trace | hexagent | hexagent-search | oracle search | best baseline | "
            "search vs hexagent | oracle vs hexagent |")
    lines = [head, "|" + "---|" * 8]
    for (cluster, trace), by_policy in req99.items():
        ref = by_policy.get(REFERENCE)
        if not ref:
            continue
        others = {p: v for p, v in by_policy.items() if p != REFERENCE and p not in SEARCHES}
        best = min(others, key=lambda p: Stat.of(list(others[p].values())).mean, default=None)
        cols = [Stat.of(list(ref.values())).format(3)]
        for name in SEARCHES:
            seeds = by_policy.get(name, {})
            cols.append(Stat.of(list(seeds.values())).format(3) if seeds else "not run")
        cols.append(f"{best} {Stat.of(list(others[best].values())).format(3)}" if best else "–")
        for name in SEARCHES:
            seeds = by_policy.get(name, {})
            paired = [100 * (1 - seeds[s] / ref[s]) for s in sorted(seeds) if s in ref]
            cols.append(f"{Stat.of(paired).format(1)} %" if paired else "–")
        lines.append(f"| {cluster} | {trace} | " + " | ".join(cols) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", type=Path, help="cells.jsonl of an evaluated headroom grid")
    args = parser.parse_args(argv)
    if not args.cells.is_file():
        parser.error(f"{args.cells}: no such file (run scripts/evaluate.py headroom first)")
    lines = headroom_rows(read_cells(args.cells))
    if len(lines) == 2:
        print(f"{args.cells}: no cell of policy '{REFERENCE}' yet", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
