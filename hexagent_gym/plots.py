"""Former home of the evaluation figures, kept so existing imports work.

The code lives in :mod:`hexagent_gym.experiments.plots`; this module only re-exports it.
matplotlib is still imported on first use, not here.
"""

from hexagent_gym.experiments.plots import attainment_figure, load_sweep_figure, plot_evaluation

__all__ = ["attainment_figure", "load_sweep_figure", "plot_evaluation"]
