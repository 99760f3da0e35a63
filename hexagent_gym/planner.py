"""The planner's simulated state Ŝ and the projections Δ(c, p, d) (docs/simulator.md).

Everything here is *scheduler-visible*: prefill and decode times carry the per-call estimation
error and output lengths are predicted ones. True service times live in the simulator only.

Projection of call c on pair (p, d) at time ``now``::

    pf_end  = free[p] + pf_est[c, p]
    arrive  = pf_end + setup[p, d] + L_in · s_per_token[p, d]
    start   = max(arrive, T_d(c))          # earliest capacity- and batch-feasible decode start
    Δ       = start + L_out_pred · τ_d(c) − now

``T_d`` treats every reservation on d as held from now until its projected release (a
conservative step function, so the earliest start is one search in the sorted releases), and
``τ_d`` is the per-token step time with the call added to d's committed batch, from an affine
(in context) table per batch size.

The code lives in :mod:`~hexagent_gym.cluster_tables` (per-cluster constants),
:mod:`~hexagent_gym.call_batch` (a window's per-call arrays), :mod:`~hexagent_gym.plan_state`
(Ŝ and its snapshot), :mod:`~hexagent_gym.projections` (Δ) and :mod:`~hexagent_gym.placement`
(the fallback's rule); this module re-exports their public names.
"""

from hexagent_gym.call_batch import CallBatch
from hexagent_gym.cluster_tables import INF, ClusterTables
from hexagent_gym.placement import earliest_pair
from hexagent_gym.plan_state import PlanState, snapshot

__all__ = ["INF", "CallBatch", "ClusterTables", "PlanState", "earliest_pair", "snapshot"]
