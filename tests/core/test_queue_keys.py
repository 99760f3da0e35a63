"""Queue keys: one int per call that orders as the pair (group, order within the group)."""

from __future__ import annotations

import numpy as np

from hexagent_gym.planning.entities import PLANNED, PREEMPTED, UNPLANNED, head_index


class _Queued:
    __slots__ = ("queue_key",)

    def __init__(self, key: int) -> None:
        self.queue_key = key


def test_keys_order_as_group_then_order():
    rng = np.random.default_rng(0)
    groups = (PREEMPTED, PLANNED, UNPLANNED)
    # orders near both ends of the range a key holds (an episode's counters stay far below it)
    orders = np.concatenate([rng.integers(0, 1000, 300), rng.integers(2**40 - 1000, 2**40, 300)])
    pairs = [(int(g), int(o)) for g, o in zip(rng.integers(0, 3, len(orders)), orders,
                                              strict=True)]
    by_key = sorted(pairs, key=lambda p: groups[p[0]] + p[1])
    assert by_key == sorted(pairs)
    assert PREEMPTED + 2**40 - 1 < PLANNED < PLANNED + 2**40 - 1 < UNPLANNED


def test_head_index_is_the_first_smallest_key():
    queue = [_Queued(k) for k in (UNPLANNED + 3, PLANNED + 5, PREEMPTED + 7, PLANNED + 1,
                                  PREEMPTED + 7, PREEMPTED + 9)]
    assert head_index(queue) == 2  # the preempted call with the lowest order, first of the tie
    queue[2].queue_key = UNPLANNED
    assert head_index(queue) == 4
    assert head_index([_Queued(UNPLANNED + 2), _Queued(UNPLANNED + 1)]) == 1
