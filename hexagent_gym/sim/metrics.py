"""Workflow-level SLO metrics: C_w/H_w ratios, Req_τ and attainment curves (docs/simulator.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from hexagent_gym.sim.timeline import Timeline


def req(ratios: np.ndarray, tau: float) -> float:
    """Req_τ: the smallest SLO scale α with at least a fraction τ of workflows meeting α·H_w.

    That is the ⌈τ·n⌉-th smallest ratio C_w/H_w (1-based). NaN for an empty episode.
    """
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"tau must be in (0, 1], got {tau}")
    n = len(ratios)
    if n == 0:
        return math.nan
    k = max(1, math.ceil(tau * n - 1e-9))  # guard τ·n that is an integer up to rounding
    return float(np.partition(np.asarray(ratios, dtype=np.float64), k - 1)[k - 1])


def attainment(ratios: np.ndarray, alpha: float | np.ndarray) -> float | np.ndarray:
    """Fraction of workflows with C_w ≤ α·H_w, for one α or an array of them."""
    r = np.sort(np.asarray(ratios, dtype=np.float64))
    if len(r) == 0:
        return math.nan if np.ndim(alpha) == 0 else np.full(np.shape(alpha), math.nan)
    frac = np.searchsorted(r, alpha, side="right") / len(r)
    return float(frac) if np.ndim(alpha) == 0 else frac


def slo_ratio(arrival: float, finish: float, horizon: float) -> float:
    """A workflow's completion time relative to its standalone time, ``(C_w − a_w) / H_w``
    (the SLO scale it needed; the one place the metric's ratio is written)."""
    return (finish - arrival) / horizon


@dataclass(slots=True)
class WorkflowRecord:
    """Outcome of one workflow of an episode (times in simulated seconds)."""

    workflow_id: str
    trace_index: int
    arrival: float
    finish: float
    horizon: float
    num_calls: int

    @property
    def ratio(self) -> float:
        return slo_ratio(self.arrival, self.finish, self.horizon)


@dataclass(slots=True)
class EpisodeResult:
    """Metrics of one simulated episode.

    Attributes:
        ratios: C_w/H_w per workflow, in the episode's workflow order.
        records: per-workflow arrival, finish and horizon.
        num_calls: LLM calls served.
        invocations: scheduling invocations (decision points).
        decisions: picks made by the policy over all invocations.
        scheduler_seconds: wall time spent building projections and picking.
        sim_seconds: simulated time at which the last call finished.
        wall_seconds: wall time inside ``run_until_decision`` (the event loop, including
            building decision points), without the policy's picks between them.
        policy: name of the policy that ran (informational).
        invocation_seconds: wall time of each invocation (projections + policy picks).
        prompt_tokens: prompt tokens of every call served.
        cached_tokens: of those, tokens served from a prefix cache (a sample-group rider's
            whole prompt counts: its leader's prefill served it).
        prefill_load: ρ with the cache: prefill-pool seconds of the work actually computed per
            second of arrivals (``hexagent_gym.sim.load``'s definition at the realised hits).
        decode_kv_peak: max over decode instances of the peak true KV in use ÷ capacity.
        preemptions: decode preemptions (a call whose true KV outgrew the reservation of its
            predicted demand pushed the instance to capacity).
        decode_wait_mean: mean seconds a call waited in decode queues (all its waits).
        decode_kv_delayed: share of calls that waited while their decode instance's queue head
            could not get KV (capacity, not batch size, held them back).
        decode_moves: free waiting decode calls a plan moved to another decode instance.
        fault_events: instance faults that started (``faults``, docs/faults.md).
        fault_reexecuted_calls: times a call lost work it had started (its prefill, KV or
            decode) to a failed instance and was served again from its prefill.
        fault_recomputed_tokens: the work those calls lost: uncached prompt tokens prefilled
            and output tokens decoded before the failure (computed again).
        fault_replaced_calls: placed calls whose prefill had not started, re-placed because
            their instance failed or was drained (nothing lost).
        timeline: the episode's :class:`~hexagent_gym.sim.timeline.Timeline` (every prefill,
            transfer, wait, recompute and decode interval) when it ran with
            ``record_timeline=True``; None otherwise. Not part of :meth:`to_dict`.
    """

    ratios: np.ndarray
    records: list[WorkflowRecord]
    num_calls: int
    invocations: int
    decisions: int
    scheduler_seconds: float
    sim_seconds: float
    wall_seconds: float
    policy: str = ""
    invocation_seconds: np.ndarray = field(default_factory=lambda: np.zeros(0))
    extra: dict[str, Any] = field(default_factory=dict)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    prefill_load: float = math.nan
    decode_kv_peak: float = 0.0
    preemptions: int = 0
    decode_wait_mean: float = 0.0
    decode_kv_delayed: float = 0.0
    decode_moves: int = 0
    fault_events: int = 0
    fault_reexecuted_calls: int = 0
    fault_recomputed_tokens: float = 0.0
    fault_replaced_calls: int = 0
    timeline: Timeline | None = None

    @property
    def num_workflows(self) -> int:
        return len(self.ratios)

    @property
    def prefix_hit_rate(self) -> float:
        """Prompt tokens served from cache ÷ all prompt tokens of the episode's calls."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def faster_than_alone(self) -> float:
        """Share of workflows that finished sooner than alone (C_w < H_w): others' cached
        prefixes sped them up."""
        return float(np.mean(self.ratios < 1.0 - 1e-9)) if len(self.ratios) else math.nan

    @property
    def req95(self) -> float:
        return req(self.ratios, 0.95)

    @property
    def req99(self) -> float:
        return req(self.ratios, 0.99)

    def req(self, tau: float) -> float:
        return req(self.ratios, tau)

    def attainment(self, alpha: float | np.ndarray) -> float | np.ndarray:
        return attainment(self.ratios, alpha)

    @property
    def scheduler_ms_per_invocation(self) -> float:
        """Mean scheduler wall time per invocation, milliseconds."""
        return 1e3 * self.scheduler_seconds / self.invocations if self.invocations else 0.0

    @property
    def scheduler_ms_median(self) -> float:
        """Median scheduler wall time per invocation, milliseconds."""
        s = self.invocation_seconds
        return 1e3 * float(np.median(s)) if len(s) else 0.0

    def to_dict(self, include_records: bool = True) -> dict[str, Any]:
        """JSON-ready summary; per-workflow ratios always included."""
        out: dict[str, Any] = {
            "policy": self.policy,
            "num_workflows": self.num_workflows,
            "num_calls": self.num_calls,
            "req95": self.req95,
            "req99": self.req99,
            "mean_ratio": float(np.mean(self.ratios)) if len(self.ratios) else math.nan,
            "invocations": self.invocations,
            "decisions": self.decisions,
            "scheduler_seconds": self.scheduler_seconds,
            "scheduler_ms_per_invocation": self.scheduler_ms_per_invocation,
            "scheduler_ms_median": self.scheduler_ms_median,
            "sim_seconds": self.sim_seconds,
            "wall_seconds": self.wall_seconds,
            "prefix_hit_rate": self.prefix_hit_rate,
            "prefill_load": self.prefill_load,
            "faster_than_alone": self.faster_than_alone,
            "decode_kv_peak": self.decode_kv_peak,
            "preemptions": self.preemptions,
            "decode_wait_mean": self.decode_wait_mean,
            "decode_kv_delayed": self.decode_kv_delayed,
            "decode_moves": self.decode_moves,
            "fault_events": self.fault_events,
            "fault_reexecuted_calls": self.fault_reexecuted_calls,
            "fault_recomputed_tokens": self.fault_recomputed_tokens,
            "fault_replaced_calls": self.fault_replaced_calls,
            "ratios": [float(x) for x in self.ratios],
        }
        if include_records:
            out["records"] = [
                {"workflow_id": r.workflow_id, "trace_index": r.trace_index,
                 "arrival": r.arrival, "finish": r.finish, "horizon": r.horizon,
                 "num_calls": r.num_calls}
                for r in self.records
            ]
        out.update(self.extra)
        return out
