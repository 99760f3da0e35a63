"""The simulation clock: a heap of ``(time, phase, seq, kind, payload)`` entries.

Phases order events that share a timestamp: completions free resources first, then new work
arrives, then landed plans and scheduling decisions run, and dispatch (starting prefills and
admitting decodes) comes last so that it sees every plan made at that instant.
"""

from __future__ import annotations

import heapq
import itertools
from enum import IntEnum
from typing import Any


class Phase(IntEnum):
    """Same-time ordering of event kinds (lower runs first)."""

    DECODE_DONE = 0
    PREFILL_DONE = 1
    TRANSFER_DONE = 2
    REVEAL = 3
    ARRIVAL = 4
    PLAN_LANDS = 5
    SCHEDULE = 6
    DISPATCH = 7


class EventQueue:
    """A min-heap of events; ``seq`` (a per-queue counter) keeps same-time same-phase order FIFO."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()

    def push(self, time: float, phase: Phase, payload: Any) -> None:
        heapq.heappush(self._heap, (time, phase, next(self._seq), payload))

    def pop(self) -> tuple[float, int, int, Any]:
        return heapq.heappop(self._heap)

    def peek_time(self) -> float:
        return self._heap[0][0]

    def __len__(self) -> int:
        return len(self._heap)
