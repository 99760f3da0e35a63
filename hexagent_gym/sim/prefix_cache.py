"""A prefill instance's prefix (KV) cache: RadixAttention semantics over chained block ids.

Block ids are chained (``hexagent_gym.workload.prompts``): a block's id fixes every token before it,
so a flat map of ids is a radix tree whose edges are blocks, and a prompt's match is its longest run
of leading ids present in the map.

SGLang semantics, at block granularity:

- a prefill *locks* the path it matched when it starts and the blocks it inserts when it ends;
  the locks hold until its KV has left for the decode instance (the transfer's end);
- insertion happens when the prefill ends, evicting *unreferenced leaves* in least-recently-used
  order until the new blocks fit; blocks that cannot fit because everything left is locked are
  not inserted (their suffix is simply not cached);
- every match or insert touches the whole path, leaf first, so a parent is always more recently
  used than its children: the least-recently-used unreferenced block is then always a leaf, and
  evicting from the front of the LRU order never orphans a cached child.

Capacity is in blocks (``capacity_tokens // block_tokens``); a partial last block occupies a
whole block, as a page does in a paged KV pool.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hexagent_gym.planning import kernels

if TYPE_CHECKING:
    from hexagent_gym.planning.cluster_tables import ClusterTables
    from hexagent_gym.planning.entities import Call


class PrefixCache:
    """LRU block cache of one prefill instance.

    Args:
        capacity_tokens: KV tokens the cache may hold (``None``: unbounded).
        block_tokens: tokens per block.
        holders: an index shared by the caches of a cluster, block id -> bit mask of the caches
            holding it (see :func:`match_levels`); this cache keeps its bit current.
        bit: this cache's bit in ``holders`` (its prefill instance's index).
    """

    __slots__ = ("block_tokens", "capacity", "_lru", "_refs", "evictions", "inserted",
                 "holders", "_bit")

    def __init__(self, capacity_tokens: int | None, block_tokens: int,
                 holders: dict[int, int] | None = None, bit: int = 0) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        if capacity_tokens is not None and capacity_tokens < 0:
            raise ValueError(f"capacity_tokens must be >= 0 or None, got {capacity_tokens}")
        self.block_tokens = block_tokens
        self.capacity = None if capacity_tokens is None else capacity_tokens // block_tokens
        self._lru: OrderedDict[int, None] = OrderedDict()  # oldest first
        self._refs: dict[int, int] = {}  # locked block -> lock count
        self.evictions = 0
        self.inserted = 0
        self.holders = holders
        self._bit = 1 << bit

    def __deepcopy__(self, memo: dict) -> PrefixCache:
        """An exact copy for a fork (``hexagent_gym.sim.fork``): every container holds ints only,
        so flat copies are deep ones; copying them flat keeps a fork's cost off the cache's size
        (a full cache holds tens of thousands of blocks). ``holders`` stays shared among the
        copies of one cluster's caches, as it is among the originals."""
        new = PrefixCache.__new__(PrefixCache)
        memo[id(self)] = new
        new.block_tokens, new.capacity = self.block_tokens, self.capacity
        new.evictions, new.inserted, new._bit = self.evictions, self.inserted, self._bit
        new._lru = self._lru.copy()
        new._refs = self._refs.copy()
        holders = self.holders
        if holders is not None:
            copied = memo.get(id(holders))
            if copied is None:
                copied = memo[id(holders)] = holders.copy()
            holders = copied
        new.holders = holders
        return new

    def __len__(self) -> int:
        """Blocks cached now."""
        return len(self._lru)

    def __contains__(self, block: int) -> bool:
        return block in self._lru

    def match(self, blocks: Sequence[int]) -> int:
        """Leading blocks of ``blocks`` that are cached (no side effects)."""
        lru = self._lru
        k = 0
        for b in blocks:
            if b not in lru:
                break
            k += 1
        return k

    def lock(self, blocks: Sequence[int], k: int, touch: bool = True) -> int:
        """Match ``blocks``, lock (and with ``touch``, touch) the matched path; returns the matched
        count ``k`` (the caller passes ``k`` = :meth:`match` when it already knows it, or −1).

        A prefill that will :meth:`insert` may skip the touch: the insert touches the whole
        path, and locked blocks cannot be evicted meanwhile."""
        kernel = kernels.cache_lock
        if kernel is not None:
            lru = self._lru  # its bound move_to_end is the kernel's touch (asked for each call:
            # a simulator fork deep-copies the cache, and a kept bound method would not follow)
            return kernel(lru, self._refs, lru.move_to_end if touch else None, blocks, k)
        if k < 0:
            k = self.match(blocks)
        lru, refs = self._lru, self._refs
        for i in range(k - 1, -1, -1):  # leaf first: parents end up more recent than children
            b = blocks[i]
            if touch:
                lru.move_to_end(b)
            refs[b] = refs.get(b, 0) + 1
        return k

    def insert(self, blocks: Sequence[int], start: int) -> int:
        """Insert ``blocks[start:]`` after a prefill of ``blocks`` whose first ``start`` blocks are
        locked by it; lock what is inserted. Returns the number of blocks now locked by the
        prefill (``start`` plus those inserted; they are ``blocks[:returned]``)."""
        kernel = kernels.cache_insert
        if kernel is None:
            return self._insert_python(blocks, start)
        lru = self._lru
        touch = lru.move_to_end
        end = start
        while True:  # the kernel stops at each block that needs an eviction
            end, added, full = kernel(lru, self._refs, self.holders, self._bit, blocks, end,
                                      self.capacity, touch)
            self.inserted += added
            if not full:
                return end
            if not self._evict_one():  # everything left is locked: the suffix is not cached
                for i in range(end - 1, -1, -1):
                    touch(blocks[i])
                return end

    def _insert_python(self, blocks: Sequence[int], start: int) -> int:
        """:meth:`insert` in pure Python: the reference of ``kernels.cache_insert``."""
        lru, refs = self._lru, self._refs
        end = start
        n = len(blocks)
        cap = self.capacity
        while end < n:
            b = blocks[end]
            if b not in lru:
                if cap is not None and len(lru) >= cap and not self._evict_one():
                    break
                lru[b] = None
                self.inserted += 1
                if self.holders is not None:
                    self.holders[b] = self.holders.get(b, 0) | self._bit
            refs[b] = refs.get(b, 0) + 1  # locked at once: a later eviction must not take it
            end += 1
        for i in range(end - 1, -1, -1):
            lru.move_to_end(blocks[i])
        return end

    def unlock(self, blocks: Sequence[int], k: int) -> None:
        """Release the locks a prefill holds on ``blocks[:k]``."""
        kernel = kernels.cache_unlock
        if kernel is not None:
            kernel(self._refs, blocks, k)
            return
        refs = self._refs
        for i in range(k):
            b = blocks[i]
            left = refs[b] - 1
            if left:
                refs[b] = left
            else:
                del refs[b]

    def clear(self) -> None:
        """Drop every block and lock (the instance failed: its KV memory is gone)."""
        holders, bit = self.holders, self._bit
        if holders is not None:
            for b in self._lru:
                left = holders[b] & ~bit
                if left:
                    holders[b] = left
                else:
                    del holders[b]
        self._lru.clear()
        self._refs.clear()

    def locked(self) -> int:
        """Blocks locked now."""
        return len(self._refs)

    def _evict_one(self) -> bool:
        refs = self._refs
        for b in self._lru:
            if b not in refs:
                del self._lru[b]
                self.evictions += 1
                if self.holders is not None:
                    left = self.holders[b] & ~self._bit
                    if left:
                        self.holders[b] = left
                    else:
                        del self.holders[b]
                return True
        return False

    def blocks(self) -> list[int]:
        """Cached block ids, least recently used first (for tests and inspection)."""
        return list(self._lru)


def match_levels(holders: dict[int, int], blocks: Sequence[int]) -> list[tuple[int, int]]:
    """Every cache's :meth:`PrefixCache.match` of ``blocks`` at once, from the shared index.

    Returns ``(k, mask)`` pairs, k >= 1: the caches whose bits are in ``mask`` match exactly k
    leading blocks (caches matching none are left out). Costs one lookup per matched block,
    whatever the number of caches. Runs the compiled twin when it is built and the masks fit
    in 64 bits (up to 64 prefill instances).
    """
    if kernels.match_levels is not None:
        levels = kernels.match_levels(holders, blocks)
        if levels is not None:
            return levels
    return match_levels_python(holders, blocks)


def match_levels_python(holders: dict[int, int],
                        blocks: Sequence[int]) -> list[tuple[int, int]]:
    """:func:`match_levels` in pure Python: the reference of its compiled twin."""
    levels = []
    alive = -1  # caches holding every block so far (all bits set)
    k = 0
    for b in blocks:
        now = alive & holders.get(b, 0)
        if now != alive and k:  # caches dropping out here matched exactly k blocks
            levels.append((k, alive & ~now))
        alive = now
        if not alive:
            return levels
        k += 1
    if k:
        levels.append((k, alive))
    return levels


def cache_view(tables: ClusterTables, holders: dict[int, int], block_tokens: int,
               call: Call) -> tuple[tuple[int, ...] | None, Sequence[float]]:
    """The scheduler's view of a waiting call against the caches as they are: prompt tokens
    each prefill instance holds for it (None when none holds any) and the cache-aware prefill
    estimates per instance (the cold ones where nothing hits)."""
    return view_of_levels(tables, match_levels(holders, call.spec.blocks), block_tokens, call)


def view_of_levels(tables: ClusterTables, levels: list[tuple[int, int]], block_tokens: int,
                   call: Call) -> tuple[tuple[int, ...] | None, Sequence[float]]:
    """:func:`cache_view` from the caches' :func:`match_levels` of the call's prompt: a function
    of ``levels`` and the call's constants only, so equal levels give equal views."""
    if not levels:
        return None, call.pf_cold
    l_in, err = call.l_in, call.pf_err
    cls = tables.pf_class_list
    hits = [0] * tables.num_prefill
    est = list(call.pf_cold)
    for k, mask in levels:
        h = k * block_tokens
        if h > l_in:
            h = l_in
        per_class = tables.prefill_times_hit(l_in, h)
        if err != 1.0:  # scaled once per class: its instances share one float (x * 1.0 is x)
            per_class = [x * err for x in per_class]
        while mask:
            low = mask & -mask
            p = low.bit_length() - 1
            mask ^= low
            hits[p] = h
            est[p] = per_class[cls[p]]
    # as tuples: the collector untracks a tuple of numbers at its first pass, while a list of
    # P numbers per waiting call is traversed at every collection (at large clusters, a large
    # share of their cost)
    return tuple(hits), tuple(est)
