"""Former home of the Ray backend, kept so existing imports work.

The code lives in :mod:`hexagent_gym.experiments.ray_backend` (chunking in
:mod:`hexagent_gym.experiments.chunks`); this module only re-exports the names it used to
provide. Importing it does not import ray.
"""

from hexagent_gym.experiments.cells import Cell, CellFailure
from hexagent_gym.experiments.chunks import TASKS_PER_CPU, auto_chunk_size, chunk_cells, run_chunk
from hexagent_gym.experiments.ray_backend import (
    AUTH_HINT,
    CODE_PACKAGES,
    INSTALL_HINT,
    check_reachable,
    code_runtime_env,
    ray_outcomes,
    ray_session,
    require_ray,
)

__all__ = [
    "AUTH_HINT", "CODE_PACKAGES", "INSTALL_HINT", "TASKS_PER_CPU", "Cell", "CellFailure",
    "auto_chunk_size", "check_reachable", "chunk_cells", "code_runtime_env", "ray_outcomes",
    "ray_session", "require_ray", "run_chunk",
]
