"""What a run of an experiment produced: :class:`Evaluation` (records, failures, counts)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hexagent_gym.experiments.cells import CellFailure
from hexagent_gym.experiments.grid import Experiment
from hexagent_gym.experiments.stats import Row, summarize


@dataclass
class Evaluation:
    """Records of an experiment's finished cells, in grid order, plus how many were
    (re)computed and the cells that failed (:class:`CellFailure`, absent from ``records``)."""

    experiment: Experiment
    records: list[dict[str, Any]]
    computed: int = 0
    reused: int = 0
    wall_seconds: float = 0.0
    failures: list[CellFailure] = field(default_factory=list)
    backend: str = "local"

    @property
    def complete(self) -> bool:
        """True when every cell of the grid has a record (no failures)."""
        return not self.failures

    def summary(self) -> list[Row]:
        """The table rows of the records under the experiment's report settings."""
        return summarize(self.records, self.experiment.report)
