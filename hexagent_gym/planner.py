"""The planner: its simulated state Ŝ and the projections Δ(c, p, d) (docs/simulator.md).

The projection formula is stated in :mod:`~hexagent_gym.projections`.

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
