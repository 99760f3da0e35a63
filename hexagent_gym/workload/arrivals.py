"""Episode workloads: which workflows of a trace an episode serves, and when each one arrives.

All randomness comes from the ``numpy.random.Generator`` the caller passes in (the episode's
seeded generator), so the same seed always gives the same episode and no global state is touched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NoReturn

import numpy as np

from hexagent_gym.workload.lazy_trace import LazyWorkflows, NoArrivalTimes, TooFewWorkflows
from hexagent_gym.workload.workload import Trace, WorkflowSpec


@dataclass(frozen=True, eq=False)
class EpisodeWorkload:
    """The workflows of one episode with their arrival times.

    ``arrivals`` and ``trace_indices`` are read-only arrays aligned with ``workflows``.
    """

    workflows: tuple[WorkflowSpec, ...]
    """The sampled workflows, in arrival order."""
    arrivals: np.ndarray
    """Arrival time of each workflow in seconds (float64, non-decreasing)."""
    trace_indices: np.ndarray
    """Index into ``trace.workflows`` of each sampled workflow (int64)."""

    def __post_init__(self) -> None:
        arrivals = np.array(self.arrivals, dtype=np.float64)
        indices = np.array(self.trace_indices, dtype=np.int64)
        n = len(self.workflows)
        if arrivals.shape != (n,) or indices.shape != (n,):
            raise ValueError(f"arrivals {arrivals.shape} and trace_indices {indices.shape} must "
                             f"both have shape ({n},), one entry per workflow")
        if n and (not np.all(np.isfinite(arrivals)) or np.any(np.diff(arrivals) < 0)):
            raise ValueError("arrivals must be finite and non-decreasing")
        arrivals.setflags(write=False)
        indices.setflags(write=False)
        # Frozen dataclass: normalised copies are stored through object.__setattr__.
        object.__setattr__(self, "arrivals", arrivals)
        object.__setattr__(self, "trace_indices", indices)

    def __len__(self) -> int:
        return len(self.workflows)


def sample_episode(trace: Trace, num_workflows: int | None, rng: np.random.Generator,
                   arrival_rate: float | None) -> EpisodeWorkload:
    """Pick an episode's workflows from a trace and give each one an arrival time.

    Args:
        trace: the trace to draw from.
        num_workflows: how many workflows the episode serves; None means every workflow of the
            trace once.
        rng: the episode's generator; the only source of randomness.
        arrival_rate: workflows per second of a Poisson arrival process; None replays the
            trace's own ``arrival_s`` times.

    With ``arrival_rate`` (Poisson mode) the workflows are drawn at random: a count up to the
    trace size is a sample without replacement, in the sampled order (None is a random
    permutation of the whole trace). A larger count concatenates independent random permutations
    of the trace and keeps the first ``num_workflows`` entries, so every workflow is used
    ``floor(n / len(trace))`` or ``ceil(n / len(trace))`` times. Inter-arrival gaps are
    independent Exponential draws with mean ``1 / arrival_rate``; workflow ``i`` arrives at the sum
    of the first ``i + 1`` gaps, so the first one arrives after one gap, not at 0.

    Without ``arrival_rate`` (replay mode) no randomness is used: the workflows are taken in
    order of their ``arrival_s`` (ties keep file order), the first ``num_workflows`` of them, and
    the arrival times are kept exactly as given in the file.

    A lazily read trace (``workload.open_trace``) gives the same episode and reads only what it
    needs: its size and the sampled workflows (Poisson), or the arrival times and the first
    ``num_workflows`` workflows (replay; a Mooncake file, sorted by time, only its first rows).

    Raises:
        ValueError: ``num_workflows`` is not a positive integer, ``arrival_rate`` is not a positive
            finite number, or replay was asked for but the trace has no arrival times (or fewer
            workflows than requested).
        TypeError: ``rng`` is not a ``numpy.random.Generator``.
    """
    # a lazy trace replaying a prefix need not count its lines (a Mooncake file is then read
    # only as far as the rows replayed); it is never empty (open_trace and split_trace check)
    counted = not (isinstance(trace.workflows, LazyWorkflows) and arrival_rate is None
                   and num_workflows is not None)
    size = len(trace.workflows) if counted else 1
    if size == 0:
        raise ValueError(f"trace '{trace.name}' has no workflows to sample")
    if num_workflows is not None and (isinstance(num_workflows, bool)
                                      or not isinstance(num_workflows, int | np.integer)
                                      or num_workflows <= 0):
        raise ValueError(f"num_workflows must be a positive integer or None (the whole trace), "
                         f"got {num_workflows!r}")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator (e.g. np.random.default_rng(seed)), "
                        f"got {type(rng).__name__}")
    if arrival_rate is None:
        return _replay(trace, size if num_workflows is None else int(num_workflows))
    numeric = int | float | np.integer | np.floating
    if (isinstance(arrival_rate, bool) or not isinstance(arrival_rate, numeric)
            or not math.isfinite(arrival_rate) or arrival_rate <= 0):
        raise ValueError(f"arrival_rate must be a positive finite number of workflows per second "
                         f"(or None to replay the trace's arrival_s), got {arrival_rate!r}")
    n = size if num_workflows is None else int(num_workflows)
    rounds = -(-n // size)  # ceil(n / size) whole permutations, then truncated to n
    indices = np.concatenate([rng.permutation(size) for _ in range(rounds)])[:n]
    arrivals = np.cumsum(rng.exponential(1.0 / float(arrival_rate), size=n))
    return _episode(trace, indices, arrivals)


def _replay(trace: Trace, n: int) -> EpisodeWorkload:
    if isinstance(trace.workflows, LazyWorkflows):
        try:
            indices, times = trace.workflows.replay_order(n)
        except NoArrivalTimes as exc:
            _no_arrival(trace, exc.workflow)
        except TooFewWorkflows as exc:
            _too_few(trace, n, exc.size)
        return _episode(trace, indices, times)
    missing = next((w for w in trace.workflows if w.arrival_s is None), None)
    if missing is not None:
        _no_arrival(trace, missing)
    size = len(trace.workflows)
    if n > size:
        _too_few(trace, n, size)
    times = np.array([w.arrival_s for w in trace.workflows], dtype=np.float64)
    indices = np.argsort(times, kind="stable")[:n]
    return _episode(trace, indices, times[indices])


def _no_arrival(trace: Trace, missing: WorkflowSpec) -> NoReturn:
        raise ValueError(f"trace '{trace.name}' ({trace.source}) has no arrival times (workflow "
                         f"'{missing.workflow_id}' on line {missing.line} has arrival_s = null); "
                         f"pass arrival_rate to draw Poisson arrivals instead")


def _too_few(trace: Trace, n: int, size: int) -> NoReturn:
    raise ValueError(f"num_workflows = {n} but trace '{trace.name}' has only {size} "
                     f"workflows to replay; ask for at most {size} or pass arrival_rate")


def _episode(trace: Trace, indices: np.ndarray, arrivals: np.ndarray) -> EpisodeWorkload:
    if isinstance(trace.workflows, LazyWorkflows):  # one read of the file for them all
        workflows = tuple(trace.workflows.take(indices.tolist()))
    else:
        workflows = tuple(trace.workflows[i] for i in indices.tolist())
    return EpisodeWorkload(workflows=workflows, arrivals=arrivals,
                           trace_indices=indices.astype(np.int64))
