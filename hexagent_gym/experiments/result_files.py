"""The result files of an evaluation: ``results.json`` (experiment, table rows and every cell
record, grid order) and ``tables.md`` (the markdown report)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from hexagent_gym.experiments.cells import jsonable
from hexagent_gym.experiments.grid import METRICS
from hexagent_gym.experiments.report import report_text
from hexagent_gym.experiments.result import Evaluation
from hexagent_gym.experiments.stats import mean_reduction

RESULTS_FILE = "results.json"
TABLES_FILE = "tables.md"


def results_json(evaluation: Evaluation) -> dict[str, Any]:
    """The whole evaluation as JSON-ready data: experiment, table rows and every cell record."""
    exp = evaluation.experiment
    rows = evaluation.summary()
    return {
        "experiment": exp.name,
        "description": exp.description,
        "source": exp.source,
        "report": jsonable(dataclasses.asdict(exp.report)),
        "rows": [r.to_dict() for r in rows],
        "mean_reduction": {m: mean_reduction(rows, m) for m in METRICS},
        "cells": evaluation.records,
        **({"failures": [f.to_dict() for f in evaluation.failures]}
           if evaluation.failures else {}),
    }


def write_results(evaluation: Evaluation, out_dir: str | Path) -> list[Path]:
    """Write ``results.json`` (rows and cells, grid order) and ``tables.md``; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    res = out / RESULTS_FILE
    res.write_text(json.dumps(results_json(evaluation), indent=1) + "\n", encoding="utf-8")
    md = out / TABLES_FILE
    md.write_text(report_text(evaluation), encoding="utf-8")
    return [res, md]
