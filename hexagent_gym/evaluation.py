"""Former home of the experiment runner, kept so existing imports work.

The code lives in :mod:`hexagent_gym.experiments` (one module per concern); this module only
re-exports the names it used to define. New code imports from ``hexagent_gym.experiments``.
"""

from hexagent_gym.experiments.cell_log import CELLS_FILE, FAILURES_FILE, read_cells
from hexagent_gym.experiments.cells import (
    RECORD_SCHEMA,
    Cell,
    CellError,
    CellFailure,
    FactoryCache,
    run_cell,
    run_cells,
)
from hexagent_gym.experiments.chunks import (
    FACTORY_CACHE_SIZE,
    TASKS_PER_CPU,
    auto_chunk_size,
    chunk_cells,
    run_chunk,
)
from hexagent_gym.experiments.experiment_yaml import (
    GRID_KEYS,
    REPORT_KEYS,
    TOP_LEVEL_KEYS,
    load_experiment,
)
from hexagent_gym.experiments.grid import (
    DEFAULT_BASELINES,
    DEFAULT_POLICIES,
    METRICS,
    SLO_METRICS,
    Experiment,
    Grid,
    Report,
)
from hexagent_gym.experiments.report import (
    format_by_size,
    format_failures,
    format_overhead,
    format_table,
    report_text,
)
from hexagent_gym.experiments.result import Evaluation
from hexagent_gym.experiments.result_files import RESULTS_FILE, results_json, write_results
from hexagent_gym.experiments.runner import BACKENDS, evaluate
from hexagent_gym.experiments.stats import (
    Row,
    Stat,
    mean_reduction,
    row_key,
    size_split,
    summarize,
    t_quantile_975,
)

__all__ = [
    "BACKENDS", "CELLS_FILE", "DEFAULT_BASELINES", "DEFAULT_POLICIES", "FACTORY_CACHE_SIZE",
    "FAILURES_FILE", "GRID_KEYS", "METRICS", "RECORD_SCHEMA", "REPORT_KEYS", "RESULTS_FILE",
    "SLO_METRICS", "TASKS_PER_CPU", "TOP_LEVEL_KEYS", "Cell", "CellError", "CellFailure",
    "Evaluation", "Experiment", "FactoryCache", "Grid", "Report", "Row", "Stat",
    "auto_chunk_size", "chunk_cells", "evaluate", "format_by_size", "format_failures",
    "format_overhead", "format_table", "load_experiment", "mean_reduction", "read_cells",
    "report_text", "results_json", "row_key", "run_cell", "run_cells", "run_chunk",
    "size_split", "summarize", "t_quantile_975", "write_results",
]
