"""The experiment runner: policies × clusters × traces × loads × estimation errors × variants ×
seeds, run as cells, summarised into tables and figures.

An *experiment* (``configs/experiments/*.yaml``, schema in ``docs/evaluation.md``) expands into
*cells*, one episode of one policy each. :func:`evaluate` runs the cells that are not finished
yet and appends one JSON line per finished cell to ``cells.jsonl``, so an interrupted run
resumes where it stopped. :func:`summarize` turns the records into table rows: Req95/Req99 per
policy (mean ± 95% CI over seeds), the offered load of each row, and the reduction of the
reference policy (HexAgent) against the best of a set of baselines.

Modules, each importing only those listed before it:

- :mod:`.cells`: :class:`Cell`, the pure :func:`run_cell`, failures, the factory cache.
- :mod:`.chunks`: cells grouped by factory and cut into units of work (pool and Ray).
- :mod:`.grid`: the model: :class:`Grid`, :class:`PolicySpec`, :class:`Report`,
  :class:`Experiment`.
- :mod:`.experiment_yaml`: :func:`load_experiment`, YAML to the model with clear errors.
- :mod:`.stats`: :class:`Stat`, :class:`Row`, :func:`summarize`.
- :mod:`.result`: :class:`Evaluation`, what a run produced.
- :mod:`.cell_log`: ``cells.jsonl`` and ``failures.jsonl``.
- :mod:`.report`: markdown tables and the failure report.
- :mod:`.result_files`: ``results.json`` and ``tables.md``.
- :mod:`.ray_backend`: cells as Ray tasks (ray imported inside its functions only).
- :mod:`.runner`: :func:`evaluate` (imports the Ray backend only when asked for it).
- :mod:`.plots`: attainment curves and load sweeps (matplotlib imported on first use).
"""

from hexagent_gym.experiments.cell_log import CELLS_FILE, FAILURES_FILE, CellLog, read_cells
from hexagent_gym.experiments.cells import (
    RECORD_SCHEMA,
    Cell,
    CellError,
    CellFailure,
    FactoryCache,
    policy_label,
    run_cell,
    run_cells,
)
from hexagent_gym.experiments.chunks import (
    FACTORY_CACHE_SIZE,
    TASKS_PER_CPU,
    auto_chunk_size,
    chunk_cells,
    factory_groups,
    run_chunk,
)
from hexagent_gym.experiments.experiment_yaml import (
    GRID_KEYS,
    POLICY_ENTRY_KEYS,
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
    PolicySpec,
    Report,
)
from hexagent_gym.experiments.plots import attainment_figure, load_sweep_figure, plot_evaluation
from hexagent_gym.experiments.report import (
    format_by_size,
    format_failures,
    format_overhead,
    format_table,
    report_text,
)
from hexagent_gym.experiments.result import Evaluation
from hexagent_gym.experiments.result_files import (
    RESULTS_FILE,
    TABLES_FILE,
    results_json,
    write_results,
)
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
    "FAILURES_FILE", "GRID_KEYS", "METRICS", "POLICY_ENTRY_KEYS", "RECORD_SCHEMA", "REPORT_KEYS",
    "RESULTS_FILE", "SLO_METRICS", "TABLES_FILE", "TASKS_PER_CPU", "TOP_LEVEL_KEYS", "Cell",
    "CellError", "CellFailure", "CellLog", "Evaluation", "Experiment", "FactoryCache", "Grid",
    "PolicySpec", "Report", "Row", "Stat", "attainment_figure", "auto_chunk_size",
    "chunk_cells", "evaluate", "factory_groups", "format_by_size", "format_failures",
    "format_overhead", "format_table", "load_experiment", "load_sweep_figure", "mean_reduction",
    "plot_evaluation", "policy_label", "read_cells", "report_text", "results_json", "row_key",
    "run_cell", "run_cells", "run_chunk", "size_split", "summarize", "t_quantile_975",
    "write_results",
]
