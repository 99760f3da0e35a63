"""Running an experiment's cells: resume from ``cells.jsonl``, run the rest in this process, a
local process pool or on Ray, write each record as it finishes, keep failures apart.

The Ray backend (:mod:`hexagent_gym.experiments.ray_backend`) is imported only when asked for,
so the runner works without ray installed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from hexagent_gym.config import ConfigError
from hexagent_gym.experiments.cell_log import CellLog
from hexagent_gym.experiments.cells import Cell, CellError, CellFailure, FactoryCache, run_cells
from hexagent_gym.experiments.chunks import (
    auto_chunk_size,
    chunk_cells,
    factory_groups,
    run_chunk,
)
from hexagent_gym.experiments.grid import Experiment
from hexagent_gym.experiments.result import Evaluation

BACKENDS = ("local", "ray")
"""``local``: this process, or a process pool with ``workers > 1``; ``ray``: Ray tasks
(:mod:`hexagent_gym.experiments.ray_backend`, needs ``pip install "hexagent-gym[distributed]"``)."""


def evaluate(experiment: Experiment, out_dir: str | Path | None = None, *, resume: bool = False,
             workers: int | None = None, progress: bool = True, timing: bool = True,
             backend: str = "local", address: str | None = None,
             chunk_size: int | None = None, fail_fast: bool = False,
             on_record: Callable[[dict[str, Any]], None] | None = None,
             ray_init: Mapping[str, Any] | None = None) -> Evaluation:
    """Run an experiment's cells and collect their records.

    Every backend gives the same records (apart from the wall-clock ``timing`` blocks): a cell's
    record is a function of the cell only, and records are returned in grid order whatever the
    order they finish in.

    Args:
        experiment: the experiment (``load_experiment``).
        out_dir: where ``cells.jsonl`` grows one line per finished cell, flushed as it finishes
            (None: keep in memory). Failed cells go to ``failures.jsonl`` (parameters, error,
            traceback).
        resume: keep the finished cells already in ``out_dir/cells.jsonl`` and run only the
            rest (failed cells included); without it the file is started afresh.
        workers: ``local``: processes to run cells in (None or 1 = this process; cells sharing a
            factory go to one worker as a chunk, and groups are cut into smaller chunks when
            there are fewer than two per worker: :func:`auto_chunk_size`). ``ray`` without
            ``address``: CPUs of the local Ray instance started here (None: every core).
        progress: show a tqdm progress bar over cells.
        timing: record wall-clock timings (see :func:`run_cell`).
        backend: one of :data:`BACKENDS`.
        address: ``ray`` only: join this running Ray cluster (``HOST:6379``, ``auto``,
            ``ray://HOST:10001``) instead of starting a local instance.
        chunk_size: ``ray`` only: cells per Ray task, cut from the cells of one factory (0:
            whole factory groups; None: whole groups unless there are fewer than two per
            cluster CPU, :func:`auto_chunk_size`).
        fail_fast: stop at the first failing cell (``local`` serial: its exception propagates;
            otherwise :class:`CellError`). Without it a failing cell becomes a
            :class:`CellFailure` in ``Evaluation.failures`` and the other cells run on.
        on_record: called with each finished record right after it is written.
        ray_init: extra keyword arguments for ``ray.init`` (e.g. ``runtime_env``).

    Raises:
        ValueError: an unknown backend, or Ray options without ``backend="ray"``.
        ConfigError: the grid lists the same cell twice.
        ImportError, ConnectionError: ``ray`` missing, or ``address`` unreachable; raised
            before ``out_dir`` is touched.
    """
    from tqdm.auto import tqdm

    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    if backend != "ray" and (address is not None or ray_init):
        raise ValueError("address and ray_init apply to backend='ray' only")
    if backend == "ray":  # fail before touching cells.jsonl
        from hexagent_gym.experiments.ray_backend import check_reachable, require_ray

        require_ray()
        if address:
            check_reachable(address)
    start = time.perf_counter()
    cells = experiment.cells()
    keys = [c.key for c in cells]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"{experiment.source}: the grid lists the same cell twice (a duplicated "
                          f"policy, seed, load or variant?)")
    log = None if out_dir is None else CellLog(out_dir, keys, resume=resume, timing=timing)
    done: dict[str, dict[str, Any]] = {} if log is None else log.finished
    todo = [c for c in cells if c.key not in done]
    reused = len(cells) - len(todo)
    failures: list[CellFailure] = []
    bar = tqdm(total=len(todo), disable=not progress, unit="cell", dynamic_ncols=True)
    try:
        def finish(rec: dict[str, Any]) -> None:
            done[rec["key"]] = rec
            if log is not None:
                log.write(rec)
            bar.update(1)
            if on_record is not None:
                on_record(rec)

        def fail(failure: CellFailure) -> None:
            failures.append(failure)
            if log is not None:
                log.write_failure(failure)
            bar.set_description_str(f"{len(failures)} failed", refresh=False)
            bar.update(1)
            if fail_fast:
                raise CellError(failure)

        groups = list(factory_groups(todo))
        workers_n = 1 if workers is None else workers
        if backend == "ray":
            from hexagent_gym.experiments.ray_backend import ray_outcomes

            outcomes: Iterator[dict[str, Any] | CellFailure] = ray_outcomes(
                groups, timing=timing, address=address, num_cpus=workers,
                chunk_size=chunk_size, init_kwargs=ray_init)
        elif workers_n <= 1:
            outcomes = _serial_outcomes(groups, timing, catch=not fail_fast, bar=bar)
        else:
            outcomes = _pool_outcomes(groups, timing, workers_n)
        with contextlib.closing(outcomes):
            for outcome in outcomes:
                if isinstance(outcome, CellFailure):
                    fail(outcome)
                else:
                    finish(outcome)
    finally:
        bar.close()
        if log is not None:
            log.close()
    records = [done[k] for k in keys if k in done]
    order = {k: i for i, k in enumerate(keys)}
    failures.sort(key=lambda f: order[f.key])
    return Evaluation(experiment, records, computed=len(todo) - len(failures), reused=reused,
                      wall_seconds=time.perf_counter() - start, failures=failures,
                      backend=backend)


def _serial_outcomes(groups: Sequence[list[Cell]], timing: bool, *, catch: bool,
                     bar: Any) -> Iterator[dict[str, Any] | CellFailure]:
    cache = FactoryCache(1)
    for group in groups:
        for cell in group:
            bar.set_postfix_str(cell.describe(), refresh=False)
            yield from run_cells([cell], timing, factories=cache, catch=catch)


def _pool_outcomes(groups: Sequence[list[Cell]], timing: bool,
                   workers: int) -> Iterator[dict[str, Any] | CellFailure]:
    # Whole factory groups share one factory build, but a grid with fewer groups than workers
    # (one cluster and trace, many seeds) would leave workers idle: cut groups into chunks then.
    chunks = chunk_cells(groups, auto_chunk_size(groups, workers))
    pool = ProcessPoolExecutor(max_workers=workers)
    futures = {pool.submit(run_chunk, c, timing): c for c in chunks}
    try:
        for fut in as_completed(futures):
            try:
                outs = fut.result()
            except Exception as exc:  # the worker died (BrokenProcessPool) or did not unpickle
                outs = [CellFailure.of(c, exc) for c in futures[fut]]
            yield from outs
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
