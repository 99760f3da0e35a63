"""The CI quality check: every policy on small fixed traces, HexAgent against a committed baseline.

The simulation is deterministic, so HexAgent's Req99 on these cases only moves when scheduling
or simulation logic changes. A rise beyond the tolerance fails CI; an improvement is reported
(update the baseline with ``scripts/bench.py --ci --update-baseline`` and commit it).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.policy import make_policy, run_policy

CI_CASES = (  # (cluster, trace, workflows, arrival rate /s): the paper's rates, prefix cache on
    ("hetero-1", "bfcl_v3", 150, 40.0),
    ("hetero-1", "mixed", 30, 10.0),
    ("hetero-1", "lats", 10, 40.0),
    ("qwen-hetero-1", "sharegpt", 100, 10.0),
)
CI_POLICIES = ("hexagent", "hexagent-lookahead", "hexagent-nocache", "fcfs", "wf-fcfs", "llf",
               "atlas", "sglang-router", "random")
REFERENCE = "hexagent"


@dataclass(frozen=True)
class CaseResult:
    cluster: str
    trace: str
    num_workflows: int
    arrival_rate: float
    policy: str
    req95: float
    req99: float
    ms_per_invocation: float
    error: str = ""

    @property
    def key(self) -> str:
        return f"{self.cluster}/{self.trace}/{self.num_workflows}@{self.arrival_rate:g}/s"


def run_ci_cases(cases=CI_CASES, policies=CI_POLICIES, seed: int = 0) -> list[CaseResult]:
    """Run every policy on every case; a crashing policy is recorded with its error."""
    out = []
    for cluster, trace, n, rate in cases:
        factory = EpisodeFactory(EpisodeConfig(cluster=cluster, trace=trace, num_workflows=n,
                                               load=None, arrival_rate=rate, seed=seed))
        for name in policies:
            try:
                res = run_policy(factory.simulator(), make_policy(name), close=True)
                out.append(CaseResult(cluster, trace, n, rate, name, res.req95, res.req99,
                                      res.scheduler_ms_per_invocation))
            except Exception as exc:  # reported, and fails the check
                out.append(CaseResult(cluster, trace, n, rate, name, math.nan, math.nan,
                                      math.nan, f"{type(exc).__name__}: {exc}"))
    return out


def check(results: list[CaseResult], baseline: dict[str, float],
          tolerance: float = 0.02) -> list[str]:
    """Problems: crashed policies, and reference Req99 above baseline·(1 + tolerance)."""
    problems = [f"{r.policy} crashed on {r.key}: {r.error}" for r in results if r.error]
    for r in results:
        if r.policy != REFERENCE or r.error:
            continue
        ref = baseline.get(r.key)
        if ref is None:
            problems.append(f"no baseline for {r.key}; run with --update-baseline")
        elif r.req99 > ref * (1.0 + tolerance):
            problems.append(f"{REFERENCE} Req99 regressed on {r.key}: {r.req99:.4f} > "
                            f"baseline {ref:.4f} (+{tolerance:.0%} allowed)")
    return problems


def load_baseline(path: str | Path) -> dict[str, float]:
    path = Path(path)
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return {k: float(v) for k, v in data["req99"].items()}


def save_baseline(path: str | Path, results: list[CaseResult]) -> None:
    data = {"policy": REFERENCE,
            "req99": {r.key: r.req99 for r in results if r.policy == REFERENCE and not r.error}}
    Path(path).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def format_table(results: list[CaseResult]) -> str:
    lines = ["| case | policy | Req95 | Req99 | ms/inv |", "|---|---|---|---|---|"]
    for r in results:
        if r.error:
            lines.append(f"| {r.key} | {r.policy} | crashed: {r.error} | | |")
        else:
            lines.append(f"| {r.key} | {r.policy} | {r.req95:.3f} | {r.req99:.3f} | "
                         f"{r.ms_per_invocation:.3f} |")
    return "\n".join(lines)
