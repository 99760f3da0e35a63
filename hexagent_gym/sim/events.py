"""The simulation clock: a heap of ``(time, phase, seq, kind, payload)`` entries.

Phases order events that share a timestamp: completions free resources first, then new work
arrives, then landed plans and scheduling decisions run. Dispatch (starting prefills, admitting
decodes) is not an event: the simulator runs it once after the last event of an instant, so it
sees every plan made at that instant.
"""

from __future__ import annotations

import heapq
import itertools
from enum import IntEnum
from typing import Any


class Phase(IntEnum):
    """Same-time ordering of event kinds (lower runs first)."""

    DECODE_DONE = 0
    PREEMPT = 1  # a decode instance's true KV use reaches its capacity
    RECOMPUTE_DONE = 2  # a preempted call's KV is rebuilt; it rejoins the batch
    PREFILL_DONE = 3
    TRANSFER_DONE = 4
    REVEAL = 5
    ARRIVAL = 6
    PLAN_LANDS = 7
    SCHEDULE = 8
    FAULT = 9  # an instance fault starts or ends (hexagent_gym.sim.fault_flow; none without faults)


class EventQueue:
    """A min-heap of events; ``seq`` (a per-queue counter) keeps same-time same-phase order FIFO."""

    __slots__ = ("heap", "_seq")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int, Any]] = []  # read-only outside this class
        self._seq = itertools.count()

    def push(self, time: float, phase: Phase, payload: Any) -> None:
        heapq.heappush(self.heap, (time, phase, next(self._seq), payload))

    def pop(self) -> tuple[float, int, int, Any]:
        return heapq.heappop(self.heap)

    def __len__(self) -> int:
        return len(self.heap)
