"""The discrete-event simulator of a heterogeneous P-D cluster serving agentic workflows.

Lifecycle of a call (docs/simulator.md): hidden → waiting-prefill (revealed) → prefill on its
prefill instance (non-preemptive, one at a time) → KV transfer to its decode instance (transfers
run in parallel) → waiting-decode → decode with continuous batching → done, after which children
whose parents are all done are revealed ``tool_latency_s`` later. A decode preemption sends a
call back to waiting-decode; a free waiting-decode call may be moved to another instance.

Scheduling: arrivals and reveals trigger a prefill invocation, transfer completions a
decode invocation. ``run_until_decision`` advances to the next invocation and returns a
:class:`~hexagent_gym.planning.decisions.DecisionPoint`; the caller picks every call of it and calls
``run_until_decision`` again, which applies the plan. With ``decisions=False`` no invocation is
exposed and every call follows the fallback (FIFO order, earliest projected finish placement).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hexagent_gym.planning.cluster_tables import ClusterTables
from hexagent_gym.sim.engine import DECODE_ADMISSION, Engine, PickFn
from hexagent_gym.sim.horizon import HorizonCache

if TYPE_CHECKING:
    from hexagent_gym.cluster.cluster import ClusterSpec
    from hexagent_gym.workload.arrivals import EpisodeWorkload

__all__ = ["DECODE_ADMISSION", "PickFn", "Simulator"]


class Simulator(Engine):
    """One episode of the cluster serving a sampled workload.

    Args:
        cluster: the cluster (``hexagent_gym.cluster.cluster.load_cluster``).
        workload: the episode's workflows and arrival times (``arrivals.sample_episode``).
        estimation_error: level e of the multiplicative error on scheduler-visible prefill and
            decode times and predicted output lengths; each call draws factors ``1 + e·U(−1, 1)``.
        rng: the episode's generator; used only to draw the estimation-error factors.
        decisions: expose decision points (False: fallback only, the fastest mode).
        planning_latency: seconds between an invocation and its plan landing (0 = synchronous),
            or ``"measured"`` to use the invocation's wall time (not deterministic).
        max_calls_per_decision: window size K (None = every waiting call). The window holds the
            K oldest waiting calls of the stage; the rest keep their placement and wait FIFO
            behind planned calls until they enter a window.
        plan_depth: bound M on what an invocation re-plans (None = every waiting call, the
            exact rule, whose cost per invocation grows with the queue). The window holds the
            M oldest waiting calls of the stage plus every call not placed yet; the rest keep
            the placement a policy gave them and wait behind planned calls in reveal order
            until they are among the M oldest. Changes decisions only while more than M calls
            wait (docs/overload.md). Exclusive with ``max_calls_per_decision``.
        horizons: cache of standalone horizons H_w to share across episodes on this cluster.
        tables: precomputed cluster tables to share across episodes.
        compute_horizons: compute H_w for each workflow (the standalone runs themselves don't).
        prefix_cache: keep a prefix (KV) cache on every prefill instance
            (:mod:`hexagent_gym.sim.prefix_cache`); a prefill then computes only its uncached
            suffix.
        prefix_cache_tokens: KV tokens each prefill instance's cache holds: None sizes it from
            the instance's KV memory, ``math.inf`` makes it unbounded.
        parallel_sampling: serve a sample group (the ``n`` samples of one request) as one
            request: one prefill and one transfer, decode sharing the prompt's KV.
        length_predictor: the scheduler-visible output-length predictor
            (:mod:`hexagent_gym.futures.predictors`; a name, or a predictor object); ``"oracle"``
            shows the true lengths. Estimation error ``e`` multiplies on top of it.
        length_predictor_params: keyword arguments of a named predictor.
        decode_admission: ``"predicted"`` — decode instances reserve a call's predicted demand
            at admission and preempt (recompute) when the true KV in use reaches capacity;
            ``"true-demand"`` — reserve the true demand (never preempts; the regime before).
        free_decode_calls: a call waiting at its decode instance that the instance has not
            served yet may be re-placed on another decode instance by a plan (its KV is sent
            again: the P→D transfer time); a preempted or already moved call stays (locked).
        record_timeline: record every prefill, KV transfer, decode-queue wait, recompute and
            decode interval as it happens; the result's ``timeline`` then holds them
            (:mod:`hexagent_gym.sim.timeline`, docs/timelines.md). Changes no decision or time.
            The standalone horizon runs never record.
        checked_specs: a set the caller keeps across episodes of one cluster and serving
            options (``EpisodeFactory`` does): ids of workflow specs whose KV demand and sample
            group width already passed the start-of-episode checks; only the others are
            checked, then added. The caller keeps those specs alive (ids are reused otherwise).
        horizon_predictor: a :class:`~hexagent_gym.futures.horizon_predictors.HorizonPredictor` (one
            per episode: ``fresh()``) whose forecasts Ĥ_w the simulator writes to
            ``Workflow.h_pred`` at every decision point for the workflows it shows
            (docs/horizons.md); None: no forecasts (``h_pred`` stays 0).
        faults: instance faults (:mod:`hexagent_gym.sim.faults`, docs/faults.md): a
            :class:`~hexagent_gym.sim.faults.FaultPlan`, its mapping form, or None (no fault: no
            fault code runs). ``fault_seed`` seeds its MTBF/MTTR process (``EpisodeFactory``
            passes the episode seed).
    """

    def __init__(self, cluster: ClusterSpec, workload: EpisodeWorkload, *,
                 horizons: HorizonCache | None = None, tables: ClusterTables | None = None,
                 compute_horizons: bool = True, prefix_cache: bool = True,
                 prefix_cache_tokens: float | None = None, parallel_sampling: bool = True,
                 **options: Any) -> None:
        tables = tables if tables is not None else ClusterTables(cluster)
        if not compute_horizons:
            horizons = None
        elif horizons is None:
            horizons = HorizonCache(cluster, tables, prefix_cache=prefix_cache,
                                    prefix_cache_tokens=prefix_cache_tokens,
                                    parallel_sampling=parallel_sampling)
        super().__init__(cluster, workload, horizons=horizons, tables=tables,
                         prefix_cache=prefix_cache, prefix_cache_tokens=prefix_cache_tokens,
                         parallel_sampling=parallel_sampling, **options)
