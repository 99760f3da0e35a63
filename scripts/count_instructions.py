"""Count the CPU instructions of one env step or one simulated call, exactly, with valgrind.

Wall time on a shared 2-core machine moves by a third within minutes; the instruction count
of the same code does not, once numpy's OpenBLAS runs on one thread (its idle worker threads
spin, and valgrind, running threads one at a time, counts the spinning: docs/performance.md,
"Counting instructions exactly"). Each figure is the difference of two child processes under
valgrind that do the same set-up and then run the measured part zero times or once, so
start-up, imports and the set-up cancel; the garbage collector is off in the measured part
(whether a collection lands in it would move the count).

Usage:
    python scripts/count_instructions.py step      # per env.step: random valid actions, K = 16
    python scripts/count_instructions.py rollout   # per simulated call: a warm HexAgent rollout
    python scripts/count_instructions.py first     # per simulated call: a fresh env's first
                                                   # rollout (every standalone horizon in it)
    python scripts/count_instructions.py rollout --cluster hetero-1-x8 --num-workflows 3200
    python scripts/count_instructions.py rollout --misses   # and the cache misses per unit
    python scripts/count_instructions.py rollout --misses --cache-model host

With ``--misses`` the children also simulate a fixed cache model (L1 instruction and data
caches of 32 KB and a last-level cache of 1 MB, all 8-way with 64-byte lines: the same
figures on every machine) and the script adds the L1 data and last-level misses per unit:
what a larger working set costs beyond its instructions (each last-level miss is a trip to
memory, some 60–100 ns). ``--cache-model host`` simulates this machine's own L1 caches and L2
instead (read from Linux's ``/sys/devices/system/cpu/cpu0/cache``; the L2 as the last level:
a miss there leaves the core, and an L3 is shared with whatever else the machine runs). Each
child takes 20–60 s under valgrind (hetero-1, 400 workflows), about twice that with
``--misses``.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from hexagent_gym.config import ConfigError
from hexagent_gym.envs.benchmark import random_valid_steps
from hexagent_gym.envs.pd_cluster_env import PDClusterEnv
from hexagent_gym.policy import make_policy

UNIT = {"step": "env step", "rollout": "simulated call", "first": "simulated call"}
WHAT = tuple(UNIT)  # what can be counted
WARM_UP_STEPS = 4000  # random steps before a step count: the env's steady state
_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")
# the cache model of --misses: (size in bytes, ways, line bytes) of I1, D1 and the last level
CACHE_MODEL = ("--I1=32768,8,64", "--D1=32768,8,64", "--LL=1048576,8,64")
CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")  # Linux's description of CPU 0's caches
# the names printed for the totals of cachegrind's "D1 misses:" and "LL misses:" lines
_MISSES = {"L1 data misses": "D1", "last-level misses": "LL"}
ROOT = Path(__file__).resolve().parent.parent


def instructions_from(report: str) -> int:
    """The total of valgrind's ``I refs:`` line in a cachegrind report (its stderr)."""
    found = _REFS.search(report)
    if found is None:
        tail = "\n".join(report.strip().splitlines()[-5:])
        raise ValueError(f"no 'I refs:' line in valgrind's output; its end was:\n{tail}")
    return int(found.group(1).replace(",", ""))


def misses_from(report: str) -> dict[str, int]:
    """The totals of valgrind's ``D1 misses:`` and ``LL misses:`` lines (a cachegrind report
    with the cache simulated), by the names the script prints."""
    totals = {}
    for name, cache in _MISSES.items():
        found = re.search(cache + r"\s+misses:\s+([\d,]+)", report)
        if found is None:
            raise ValueError(f"no '{cache} misses:' line in valgrind's output (was the cache "
                             "simulated?)")
        totals[name] = int(found.group(1).replace(",", ""))
    return totals


@functools.cache  # read once: main's line and both children's commands use it
def host_cache_model(root: Path = CACHE_DIR) -> tuple[str, str, str]:
    """This machine's L1 instruction, L1 data and L2 caches as cachegrind's ``--I1``, ``--D1``
    and ``--LL`` options (size in bytes, ways, line bytes), read from ``root`` (Linux sysfs:
    one ``index*`` directory per cache with ``level``, ``type``, ``size`` such as ``48K``,
    ``ways_of_associativity`` and ``coherency_line_size``). Raises ValueError naming what is
    missing."""
    found = {}
    for index in sorted(root.glob("index*")):
        try:
            fields = {name: (index / name).read_text().strip() for name in (
                "level", "type", "size", "ways_of_associativity", "coherency_line_size")}
        except OSError as exc:
            raise ValueError(f"cannot read the cache description {index}: {exc}") from None
        size = fields["size"]
        scale = {"K": 1024, "M": 1024 ** 2}.get(size[-1:], 1)
        try:
            value = (int(size.rstrip("KM")) * scale, int(fields["ways_of_associativity"]),
                     int(fields["coherency_line_size"]))
        except ValueError:
            raise ValueError(f"{index}: unreadable size, ways or line size "
                             f"({size!r}, {fields['ways_of_associativity']!r}, "
                             f"{fields['coherency_line_size']!r})") from None
        found[(fields["level"], fields["type"])] = value
    need = {"--I1": ("1", "Instruction"), "--D1": ("1", "Data"), "--LL": ("2", "Unified")}
    missing = [f"level {lv} {kind}" for lv, kind in need.values() if (lv, kind) not in found]
    if missing:
        raise ValueError(f"{root} does not describe this machine's {', '.join(missing)} "
                         "cache(s); use --cache-model fixed")
    return tuple(f"{opt}={','.join(map(str, found[key]))}" for opt, key in need.items())


def describe_cache_model(model: tuple[str, ...]) -> str:
    """``--D1=49152,12,64`` and ``--LL=…`` as printed: "L1 data 48 KB 12-way, last level …"""
    sizes = dict(option.split("=") for option in model)
    parts = []
    for option, name in (("--D1", "L1 data"), ("--LL", "last level")):
        size, ways, _ = (int(x) for x in sizes[option].split(","))
        amount = f"{size // 1024 ** 2} MB" if size % 1024 ** 2 == 0 else f"{size // 1024} KB"
        parts.append(f"{name} {amount} {ways}-way")
    return ", ".join(parts)


def cache_model(args: argparse.Namespace) -> tuple[str, ...]:
    """The cachegrind cache options of ``args.cache_model``: the fixed model or the host's."""
    if getattr(args, "cache_model", "fixed") == "host":
        return host_cache_model()
    return CACHE_MODEL


def child_command(args: argparse.Namespace, run: int) -> list[str]:
    """The valgrind command of one child: the set-up, then the measured part ``run`` times
    (with ``args.misses``, under the cache model of ``args.cache_model``, default fixed)."""
    cache = ["--cache-sim=yes", *cache_model(args)] if getattr(args, "misses", False) else [
        "--cache-sim=no"]
    return ["valgrind", "--tool=cachegrind", *cache, "--cachegrind-out-file=/dev/null",
            sys.executable, str(Path(__file__).resolve()), args.what, "--child", str(run),
            "--cluster", args.cluster, "--trace", args.trace,
            "--num-workflows", str(args.num_workflows), "--load", str(args.load),
            "--policy", args.policy, "--steps", str(args.steps), "--seed", str(args.seed)]


def child_env() -> dict[str, str]:
    """The children's environment: one BLAS thread, fixed string hashing, the repo importable."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONHASHSEED="0")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def make_env(args: argparse.Namespace) -> PDClusterEnv:
    """The env of a count: rollouts at ``args.load``, steps at the env's default load."""
    overrides = {"load": args.load} if args.what != "step" else {}
    return PDClusterEnv(cluster=args.cluster, trace=args.trace,
                        num_workflows=args.num_workflows, seed=args.seed, **overrides)


def measure(args: argparse.Namespace) -> int:
    """Run the measured part once (``args.child`` = 1) or not at all after the set-up; return
    the units it ran (env steps or simulated calls; 0 when not run)."""
    env = make_env(args)
    rng = np.random.default_rng(args.seed)
    if args.what == "step":
        env.factory.fill_horizons()
        random_valid_steps(env, WARM_UP_STEPS, rng)
    elif args.what == "rollout":
        env.rollout(args.policy)  # the horizons and the tables' caches, filled
    gc.collect()
    gc.disable()
    try:
        if not args.child:
            return 0
        if args.what == "step":
            random_valid_steps(env, args.steps, rng)
            return args.steps
        return env.rollout(args.policy).num_calls
    finally:
        gc.enable()


def check_inputs(args: argparse.Namespace) -> None:
    """Fail at once, not after a child's start under valgrind: the env's config (cluster,
    trace, sizes) and, for rollouts, the policy name (a ConfigError or ValueError naming it)."""
    make_env(args)  # the children's env, built once here
    if args.what != "step":
        make_policy(args.policy)


def count(args: argparse.Namespace) -> tuple[dict[str, float], int]:
    """(figures per unit, units) from the two children: the instructions, and with
    ``args.misses`` the L1 data and last-level misses."""
    if shutil.which("valgrind") is None:
        raise SystemExit("count_instructions: valgrind is not on PATH; install it (Debian and "
                         "Ubuntu: apt install valgrind) or use scripts/bench.py's wall times")
    check_inputs(args)
    totals, units = [], 0
    for run in (0, 1):
        done = subprocess.run(child_command(args, run), capture_output=True, text=True,
                              env=child_env(), check=False)
        if done.returncode != 0:
            raise SystemExit(f"count_instructions: the child ({args.what}, run {run}) failed "
                             f"with exit code {done.returncode}:\n{done.stderr[-2000:]}")
        figures = {"instructions": instructions_from(done.stderr)}
        if getattr(args, "misses", False):
            figures.update(misses_from(done.stderr))
        totals.append(figures)
        units = int(done.stdout.split()[-1])
    if units < 1:
        raise SystemExit(f"count_instructions: the measured {args.what} ran no "
                         f"{UNIT[args.what]}")
    return {name: (totals[1][name] - totals[0][name]) / units for name in totals[0]}, units


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=WHAT, help="step: per env.step; rollout: per call of a "
                        "warm rollout; first: per call of a fresh env's first rollout")
    parser.add_argument("--cluster", default="hetero-1")
    parser.add_argument("--trace", default="bfcl_v3")
    parser.add_argument("--num-workflows", type=int, default=400)
    parser.add_argument("--load", type=float, default=1.0,
                        help="load of the rollouts (default 1.0, as the scaling table); a "
                        "step count runs the env's default load, as scripts/bench.py")
    parser.add_argument("--policy", default="hexagent", help="registered policy of rollouts")
    parser.add_argument("--steps", type=int, default=4000, help="env steps counted (step)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--misses", action="store_true",
                        help="also simulate a fixed cache model (L1 32 KB, last level 1 MB) "
                        "and print the L1 data and last-level misses per unit")
    parser.add_argument("--cache-model", choices=("fixed", "host"), default="fixed",
                        help="with --misses: the fixed model (the same figures on every "
                        "machine; default) or this machine's L1 caches and L2 (Linux)")
    parser.add_argument("--child", type=int, choices=(0, 1), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cache_model != "fixed" and not args.misses:
        parser.error("--cache-model chooses the cache model of --misses; add --misses")
    if args.steps < 1 or args.num_workflows < 1:
        parser.error(f"--steps and --num-workflows must be >= 1, got {args.steps} and "
                     f"{args.num_workflows}")
    if args.child is not None:
        print("units", measure(args))
        return 0
    try:
        model = cache_model(args) if args.misses else ()
        per_unit, units = count(args)
    except (ConfigError, ValueError) as exc:  # an unknown cluster, trace or policy, ...
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.what} on {args.cluster} / {args.trace}, {args.num_workflows} workflows: "
          f"{per_unit['instructions']:,.0f} instructions per {UNIT[args.what]} (over "
          f"{units:,} of them; valgrind, one BLAS thread)")
    if args.misses:
        print(f"  cache model {describe_cache_model(model)}: " + ", ".join(
            f"{per_unit[name]:,.1f} {name}" for name in _MISSES) + f" per {UNIT[args.what]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
