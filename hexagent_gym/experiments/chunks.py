"""Units of work: cells grouped by episode factory, groups cut into chunks, one chunk per task.

Shared by the local process pool (:mod:`hexagent_gym.experiments.worker_pool`) and the Ray
backend (:mod:`hexagent_gym.experiments.ray_backend`), so both cut a grid the same way and run a
chunk with the same per-process factory cache.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from hexagent_gym.episode import EpisodeConfig
from hexagent_gym.experiments.cells import Cell, CellFailure, FactoryCache, run_cells

TASKS_PER_CPU = 2
"""Automatic chunking cuts a grid into at least this many tasks per worker CPU."""
FACTORY_CACHE_SIZE = 4
"""Factories a worker process keeps across tasks (least recently used dropped first)."""
_process_factories: FactoryCache | None = None  # per worker process, built on first use


def factory_groups(cells: Iterable[Cell]) -> Iterator[list[Cell]]:
    """The cells grouped by :attr:`Cell.factory_config`, groups in first-appearance order and
    cells in their given order within a group."""
    groups: dict[EpisodeConfig, list[Cell]] = {}
    for c in cells:
        groups.setdefault(c.factory_config, []).append(c)
    yield from groups.values()


def chunk_cells(groups: Sequence[Sequence[Cell]], chunk_size: int | None) -> list[list[Cell]]:
    """Split every factory group into near-equal consecutive chunks of at most ``chunk_size``
    cells (0 or None: one chunk per group), keeping the groups' order."""
    out: list[list[Cell]] = []
    for group in groups:
        group = list(group)
        if not group:
            continue
        if not chunk_size or chunk_size >= len(group):
            out.append(group)
            continue
        pieces = math.ceil(len(group) / chunk_size)
        bounds = [round(i * len(group) / pieces) for i in range(pieces + 1)]
        out += [group[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    return out


def auto_chunk_size(groups: Sequence[Sequence[Cell]], cpus: float,
                    tasks_per_cpu: int = TASKS_PER_CPU) -> int:
    """The chunk size of ``chunk_size=None``: whole factory groups (0) when there are at least
    ``tasks_per_cpu`` groups per CPU, else the size that cuts the grid into about that many
    tasks. Whole groups build each factory once; smaller chunks keep every CPU busy when the
    groups are few or uneven (measurements: docs/distributed.md)."""
    target = max(1, int(tasks_per_cpu * max(1.0, cpus)))
    if len(groups) >= target:
        return 0
    return max(1, math.ceil(sum(len(g) for g in groups) / target))


def process_factories() -> FactoryCache:
    """This process's factory cache (:data:`FACTORY_CACHE_SIZE` entries), built on first use:
    a worker keeps its factories across the tasks it runs."""
    global _process_factories
    if _process_factories is None:
        _process_factories = FactoryCache(FACTORY_CACHE_SIZE)
    return _process_factories


def run_chunk(cells: Sequence[Cell], timing: bool = True) -> list[dict[str, Any] | CellFailure]:
    """The body of one Ray task: run the cells with this process's factory cache
    (:func:`process_factories`), turning a cell that raises into a :class:`CellFailure`. (The
    local pool runs a chunk the same way, one cell at a time so that each record streams back
    as it finishes: :mod:`hexagent_gym.experiments.worker_pool`.)"""
    return run_cells(cells, timing, factories=process_factories(), catch=True)
