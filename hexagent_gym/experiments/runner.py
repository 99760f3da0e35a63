"""Running an experiment's cells: resume from ``cells.jsonl``, run the rest in this process, a
local process pool (:mod:`hexagent_gym.experiments.worker_pool`) or on Ray, write each record as
it finishes, keep failures apart, and stop on SIGINT/SIGTERM without losing a finished cell
(:mod:`hexagent_gym.experiments.interrupts`).

The Ray backend (:mod:`hexagent_gym.experiments.ray_backend`) is imported only when asked for,
so the runner works without ray installed.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from hexagent_gym.config import ConfigError
from hexagent_gym.experiments.cell_log import CellLog
from hexagent_gym.experiments.cells import Cell, CellError, CellFailure, FactoryCache, run_cells
from hexagent_gym.experiments.chunks import auto_chunk_size, chunk_cells, factory_groups
from hexagent_gym.experiments.grid import Experiment
from hexagent_gym.experiments.interrupts import RunInterrupted, StopSignals
from hexagent_gym.experiments.result import Evaluation
from hexagent_gym.experiments.worker_pool import WorkerPool, check_cell_timeout

BACKENDS = ("local", "ray")
"""``local``: this process, or a process pool with ``workers > 1`` or a ``cell_timeout``;
``ray``: Ray tasks (:mod:`hexagent_gym.experiments.ray_backend`, needs
``pip install "hexagent-gym[distributed]"``)."""


def evaluate(experiment: Experiment, out_dir: str | Path | None = None, *, resume: bool = False,
             workers: int | None = None, progress: bool = True, timing: bool = True,
             backend: str = "local", address: str | None = None,
             chunk_size: int | None = None, fail_fast: bool = False,
             on_record: Callable[[dict[str, Any]], None] | None = None,
             ray_init: Mapping[str, Any] | None = None,
             cell_timeout: float | None = None) -> Evaluation:
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
        fail_fast: stop at the first failing cell (``local`` serial without ``cell_timeout``:
            its exception propagates; otherwise :class:`CellError`). Without it a failing cell
            becomes a :class:`CellFailure` in ``Evaluation.failures`` and the other cells run on.
        on_record: called with each finished record right after it is written.
        ray_init: extra keyword arguments for ``ray.init`` (e.g. ``runtime_env``).
        cell_timeout: ``local`` only: seconds a cell may run (None: no limit). A cell that runs
            longer becomes a failure (``CellTimeout``) and the grid goes on; its worker process
            is killed and replaced. Cells then always run in worker processes (one with
            ``workers`` None or 1), since only a process can be stopped anywhere, even inside C
            code.

    SIGINT (Ctrl-C) and SIGTERM, while the cells run in the main thread's call, stop the run
    without losing a finished cell: every record already finished (with the pool: every one the
    workers sent back) is written, the workers are stopped, and :class:`RunInterrupted` (a
    ``KeyboardInterrupt``) says how many cells are kept; ``resume=True`` runs the rest.

    Raises:
        RunInterrupted: SIGINT or SIGTERM (or a ``KeyboardInterrupt`` from ``on_record``).
        ValueError: an unknown backend, Ray options without ``backend="ray"``, or
            ``cell_timeout`` with ``backend="ray"``.
        ConfigError: ``cell_timeout`` is not a finite number > 0.
        ConfigError: the grid lists the same cell twice.
        ImportError, ConnectionError: ``ray`` missing, or ``address`` unreachable; raised
            before ``out_dir`` is touched.
    """
    from tqdm.auto import tqdm

    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    if backend != "ray" and (address is not None or ray_init):
        raise ValueError("address and ray_init apply to backend='ray' only")
    cell_timeout = check_cell_timeout(cell_timeout, "cell_timeout")
    if backend == "ray" and cell_timeout is not None:
        raise ValueError("cell_timeout applies to backend='local' only")
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
    workers_n = 1 if workers is None else workers
    pooled = backend == "local" and (workers_n > 1 or cell_timeout is not None)
    # with the pool, cells run elsewhere: a signal only asks, and the pool stops where nothing
    # is lost; in this process, it must raise to stop the running cell
    stop = StopSignals(immediate=not pooled)
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
        with stop:
            if backend == "ray":
                from hexagent_gym.experiments.ray_backend import ray_outcomes

                outcomes: Iterator[dict[str, Any] | CellFailure] = ray_outcomes(
                    groups, timing=timing, address=address, num_cpus=workers,
                    chunk_size=chunk_size, init_kwargs=ray_init)
            elif pooled:
                # Whole factory groups share one factory build, but a grid with fewer groups
                # than workers (one cluster and trace, many seeds) would leave workers idle: cut
                # groups into chunks then.
                chunks = chunk_cells(groups, auto_chunk_size(groups, workers_n))
                outcomes = WorkerPool(chunks, workers_n, timing=timing, cell_timeout=cell_timeout,
                                      stop=stop).outcomes()
            else:
                outcomes = _serial_outcomes(groups, timing, catch=not fail_fast, bar=bar)
            with contextlib.closing(outcomes):
                for outcome in outcomes:
                    with stop.held():  # a record is written whole, or not at all
                        if isinstance(outcome, CellFailure):
                            fail(outcome)
                        else:
                            finish(outcome)
            stop.check()  # a signal after the last cell still stops the caller
    except KeyboardInterrupt as exc:  # RunInterrupted, or Ctrl-C under a handler of the caller's
        signum = exc.signum if isinstance(exc, RunInterrupted) else signal.SIGINT
        path = None if log is None else log.path
        raise RunInterrupted(signum, sum(k in done for k in keys), len(keys), path) from None
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
