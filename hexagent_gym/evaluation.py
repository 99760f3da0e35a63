"""Former home of the experiment runner, kept so existing imports work.

The code lives in :mod:`hexagent_gym.experiments` (one module per concern); this module only
re-exports the names it used to define. New code imports from ``hexagent_gym.experiments``.
"""

from hexagent_gym import experiments as _experiments
from hexagent_gym.experiments import *  # noqa: F403 - the re-exports are the point

# the names this module defined before the split (a subset of the package's)
__all__ = [name for name in _experiments.__all__ if name not in (
    "CellLog", "POLICY_ENTRY_KEYS", "PolicySpec", "TABLES_FILE", "attainment_figure",
    "factory_groups", "load_sweep_figure", "plot_evaluation", "policy_label")]

