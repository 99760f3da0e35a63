"""A prefill instance's queue: its calls in insertion order, and its head in O(log n).

The head is the call with the smallest ``Call.queue_key``, the first inserted on ties: what
:func:`~hexagent_gym.planning.entities.head_index` finds by scanning a list. A scan per started
prefill costs O(queue) and a list's ``remove`` per re-placed call too, which made an overloaded
episode's cost grow with the square of its queue (docs/overload.md); here both are O(log n)
amortised and pick the same call.
"""

from __future__ import annotations

from collections.abc import Iterator
from heapq import heapify, heappop, heappush
from typing import Any

# a Call (hexagent_gym.planning.entities, which imports this module: no import back, not even for
# types)
Call = Any


class PrefillQueue(dict):
    """Calls waiting on one prefill instance, ordered by ``queue_key``.

    Contract: whoever changes the ``queue_key`` of a call in the queue calls :meth:`rekey`
    afterwards (the engine's plan application does). Iteration, ``len`` and truth are those of
    the list of calls in insertion order (``remove`` keeps the others' order).

    The mapping itself is uid → (insertion number, call): a ``dict`` subclass, so ``len`` and
    truth, asked several times per env step, stay C calls (no Python frame). The heap holds
    ``(key, insertion number, push number, call)`` entries; an entry is stale once its call
    left the queue, was inserted again, or took another key, and is dropped when it reaches the
    top. The insertion number breaks key ties as the list position would; the push number makes
    every entry distinct, so calls are never compared.
    """

    __slots__ = ("_heap", "_inserted", "_pushed")

    def __init__(self) -> None:
        super().__init__()
        self._heap: list[tuple[int, int, int, Call]] = []
        self._inserted = 0
        self._pushed = 0

    def __iter__(self) -> Iterator[Call]:
        return (call for _, call in self.values())

    def append(self, call: Call) -> None:
        """Insert ``call`` (not in the queue) at the end, under its current key."""
        self[call.uid] = entry = (self._inserted, call)
        self._inserted += 1
        self._push(entry[0], call)

    def remove(self, call: Call) -> None:
        """Take ``call`` out of the queue (KeyError if it is not in it)."""
        del self[call.uid]

    def rekey(self, call: Call) -> None:
        """Register ``call``'s new ``queue_key`` (the call is in the queue)."""
        self._push(self[call.uid][0], call)

    def pop_next(self) -> Call:
        """Remove and return the call with the smallest key (the first inserted on ties)."""
        heap, get = self._heap, self.get
        while True:
            key, inserted, _, call = heappop(heap)
            entry = get(call.uid)
            if entry is not None and entry[0] == inserted and call.queue_key == key:
                del self[call.uid]
                return call

    def _push(self, inserted: int, call: Call) -> None:
        heap = self._heap
        if len(heap) > 2 * len(self) + 64:  # mostly stale entries: rebuild (amortised)
            heap[:] = [(c.queue_key, i, n, c) for n, (i, c) in enumerate(self.values())]
            heapify(heap)
            self._pushed = len(heap)
        heappush(heap, (call.queue_key, inserted, self._pushed, call))
        self._pushed += 1
