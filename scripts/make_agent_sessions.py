"""Write the synthetic long-context agent-session trace (hexagent_gym.workload.synthetic).

Usage: python scripts/make_agent_sessions.py [--n 600] [--seed 0] [--out PATH]
The shipped ``agent_sessions`` trace is this command's output with the defaults.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import numpy as np

from hexagent_gym.workload.synthetic import agent_sessions

DEFAULT_OUT = (Path(__file__).resolve().parent.parent / "hexagent_gym" / "data" / "traces"
               / "agent_sessions.jsonl.gz")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=600, help="sessions (default 600)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    rows = agent_sessions(args.n, np.random.default_rng(args.seed))
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows).encode()
    # mtime=0: the same seed gives byte-identical files
    data = gzip.compress(text, mtime=0) if args.out.suffix == ".gz" else text
    args.out.write_bytes(data)
    calls = [c for r in rows for c in r["calls"]]
    print(f"{args.out}: {len(rows)} sessions, {len(calls)} calls, mean prompt "
          f"{np.mean([c['input_tokens'] for c in calls]):.0f} tokens, mean output "
          f"{np.mean([c['output_tokens'] for c in calls]):.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
