"""Ray backend of the experiment runner: cells as Ray tasks on one machine or a cluster.

``evaluate(experiment, out_dir, backend="ray")`` (``scripts/evaluate.py --backend ray``) lands
here. The grid's cells are grouped by episode factory (cells equal in everything but policy and
seed), each group is cut into chunks of at most ``chunk_size`` cells (by default whole groups,
unless there are too few groups to keep the cluster's CPUs busy:
:func:`~hexagent_gym.experiments.chunks.auto_chunk_size`), and every chunk is one Ray task
(:func:`~hexagent_gym.experiments.chunks.run_chunk`, one CPU). A worker process keeps a small
LRU of factories (:class:`~hexagent_gym.experiments.cells.FactoryCache`) across tasks, so chunks
of a group that land on the same worker share the cluster tables and the standalone-horizon
cache. Results stream back as tasks finish; the runner writes each record to ``cells.jsonl`` at
once, so an interrupted sweep resumes, and a cell that raises comes back as a
:class:`~hexagent_gym.experiments.cells.CellFailure` without touching the others.

This module knows nothing of the runner: it receives the factory groups and yields outcomes.
Ray is an optional dependency (``pip install "hexagent-gym[distributed]"``): this module imports
it inside functions only, and the runner imports this module only when the Ray backend is
asked for. Setup, multi-node use and measured speed-ups: ``docs/distributed.md``.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from hexagent_gym.experiments.cells import Cell, CellFailure

# chunking and the per-process chunk runner are shared with the local process pool
from hexagent_gym.experiments.chunks import auto_chunk_size, chunk_cells, run_chunk

INSTALL_HINT = ('the Ray backend needs the optional dependency ray: '
                'pip install "hexagent-gym[distributed]"')
AUTH_HINT = ("Is the address right and the head node reachable? Clusters started with "
             "`ray start` use token authentication by default since Ray 2.59: run with "
             "RAY_AUTH_MODE=token and the cluster's token in ~/.ray/auth_token or "
             "RAY_AUTH_TOKEN (`ray get-auth-token` on the head node prints it); "
             "docs/distributed.md")
CODE_PACKAGES = ("hexagent_gym",)
"""The installed package shipped to the cluster by :func:`code_runtime_env` (the env, agents,
scripts, configs and models are its sub-packages ``hexagent_gym.envs`` ...)."""

_SUBPACKAGES = ("envs", "agents", "scripts", "configs", "models")


def require_ray() -> Any:
    """Import and return ``ray``, or raise an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} ({exc})") from exc
    return ray


def code_runtime_env(stage_dir: str | Path | None = None) -> dict[str, Any]:
    """A Ray ``runtime_env`` that ships this checkout's package to every worker (``py_modules``),
    so cluster nodes need the dependencies but not the repository.

    Ray ships a folder as the package named by its basename. In an editable install the
    sub-packages ``hexagent_gym.envs`` ... live in the checkout's top-level folders, outside
    ``hexagent_gym/``, so the package is first assembled in ``stage_dir`` (a fresh temporary
    folder when None) as one ``hexagent_gym/`` folder, laid out as a wheel installs it.
    """
    import importlib
    import shutil
    import tempfile

    core = Path(importlib.import_module("hexagent_gym").__file__).resolve().parent
    stage = Path(stage_dir if stage_dir is not None else tempfile.mkdtemp(prefix="hexagent-ray-"))
    target = stage / "hexagent_gym"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(core, target, ignore=skip, dirs_exist_ok=True)
    for sub in _SUBPACKAGES:
        folder = Path(importlib.import_module(f"hexagent_gym.{sub}").__path__[0]).resolve()
        if folder != target / sub and folder.parent != core:
            shutil.copytree(folder, target / sub, ignore=skip, dirs_exist_ok=True)
    return {"py_modules": [str(target)]}


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a HOST:PORT nobody listens on (ray.init would retry for minutes)."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return  # auto, ray://..., or something ray.init resolves itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(f"cannot reach a Ray head at {address} ({exc}); start one with "
                              f"`ray start --head --port={port}` or check the address") from exc


@contextlib.contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None,
                **init_kwargs: Any) -> Iterator[Any]:
    """Connect to Ray for the duration of the block and yield the ``ray`` module.

    * Ray already initialised in this process (a notebook, a test fixture): use it as it is
      and leave it running.
    * ``address`` given: join that cluster (``HOST:6379``, ``auto``, ``ray://HOST:10001``);
      its nodes' CPUs were set by ``ray start``, so ``num_cpus`` must be None.
    * otherwise: start a private local instance with ``num_cpus`` CPUs (None: every core),
      ignoring ``RAY_ADDRESS`` and clusters started with ``ray start``, and shut it down after.
    """
    ray = require_ray()
    if ray.is_initialized():
        yield ray
        return
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, **init_kwargs}
    if address:
        if num_cpus is not None:
            raise ValueError("workers (num_cpus) sets the size of a local Ray instance; the "
                             "nodes of an existing cluster set theirs with `ray start "
                             "--num-cpus N`")
        check_reachable(address)
        try:
            ray.init(address=address, **kwargs)
        except ConnectionError as exc:
            raise ConnectionError(f"{exc}. {AUTH_HINT}") from exc
    else:
        kwargs.setdefault("include_dashboard", False)
        ray.init(address="local", num_cpus=num_cpus, **kwargs)
    try:
        yield ray
    finally:
        ray.shutdown()


def ray_outcomes(groups: Sequence[Sequence[Cell]], *, timing: bool = True,
                 address: str | None = None, num_cpus: int | None = None,
                 chunk_size: int | None = None,
                 init_kwargs: Mapping[str, Any] | None = None
                 ) -> Iterator[dict[str, Any] | CellFailure]:
    """Run the cells as Ray tasks and yield each cell's record or failure as its task finishes.

    A task that dies as a whole (its worker crashed, an argument did not unpickle) yields a
    :class:`CellFailure` for each of its cells. Closing the generator early (an interrupt, a
    fail-fast error) cancels the tasks not finished yet.
    """
    if not any(groups):
        return
    with ray_session(address, num_cpus, **dict(init_kwargs or {})) as ray:
        if chunk_size is None:
            chunk_size = auto_chunk_size(groups, ray.cluster_resources().get("CPU", 1.0))
        work = chunk_cells(groups, chunk_size)
        task = ray.remote(num_cpus=1)(run_chunk)
        pending = {task.remote(cells, timing): cells for cells in work}
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    cells = pending.pop(ref)
                    try:
                        outs = ray.get(ref)
                    except Exception as exc:  # the task failed as a whole (RayError and kin)
                        outs = [CellFailure.of(c, exc, tb=str(exc)) for c in cells]
                    yield from outs
        finally:
            for ref in pending:
                with contextlib.suppress(Exception):
                    ray.cancel(ref)
