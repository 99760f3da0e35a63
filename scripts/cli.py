"""``hexagent-gym``: the console command installed with the package.

Usage:
    hexagent-gym evaluate --config table2_3 --quick     # = python scripts/evaluate.py ...
    hexagent-gym train --total-timesteps 1024 ...       # = python scripts/train.py ...
    hexagent-gym bench --ci                             # = python scripts/bench.py ...
    hexagent-gym <command> --help

Each subcommand calls the ``main(argv)`` of ``scripts/<command>.py`` with the arguments after
the command name, so the console command and the script run the same code and accept the same
flags; the exit status is that ``main``'s return value.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import sys
from collections.abc import Iterator

PROG = "hexagent-gym"
COMMANDS: dict[str, str] = {
    "evaluate": "evaluate schedulers over a grid of clusters, traces, loads and seeds",
    "train": "train a learned scheduler with MaskablePPO (TensorBoard logging)",
    "bench": "print the simulator's speed figures (--ci: the small-trace quality check)",
}
"""Subcommand → one-line summary; ``scripts.<subcommand>`` must define ``main(argv) -> int``."""


def usage() -> str:
    """The top-level help text: the commands and how to get each one's flags."""
    width = max(map(len, COMMANDS))
    lines = [f"usage: {PROG} <command> [args ...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {summary}" for name, summary in COMMANDS.items()]
    lines += ["", f"Run '{PROG} <command> --help' for a command's flags. '{PROG} <command> ...'",
              "runs the same code as 'python scripts/<command>.py ...'."]
    return "\n".join(lines)


@contextlib.contextmanager
def _prog_name(name: str) -> Iterator[None]:
    # argparse names the program after sys.argv[0]; show "hexagent-gym evaluate" in the
    # subcommand's usage and errors rather than the console script's path
    saved = list(sys.argv)
    sys.argv[:1] = [name]
    try:
        yield
    finally:
        sys.argv[:] = saved


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``argv`` (default ``sys.argv[1:]``): ``argv[0]`` names the command, the rest
    goes to its ``main``. ``--help``/``-h`` prints the commands (exit 0); a missing or unknown
    command prints an error naming the valid ones to stderr and returns 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(f"{usage()}\n\n{PROG}: error: a command is required", file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if command in ("-h", "--help", "help"):
        print(usage())
        return 0
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, COMMANDS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        print(f"{PROG}: error: unknown command '{command}'{hint}; valid commands: "
              f"{', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    # imported on demand: train pulls in torch, which evaluate and bench do not need
    module = importlib.import_module(f"hexagent_gym.scripts.{command}")
    with _prog_name(f"{PROG} {command}"):
        return module.main(rest)


if __name__ == "__main__":
    raise SystemExit(main())
