"""Policy entries with arguments and labels (``grid.policies: [{name, label, kwargs}]``): cell
expansion, tables, validation, the ATLAS ablation grid and the command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hexagent_gym.agents.baselines import Atlas
from hexagent_gym.config import ConfigError
from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.experiments import (
    Cell,
    Experiment,
    Grid,
    PolicySpec,
    Report,
    evaluate,
    format_table,
    load_experiment,
    run_cell,
    summarize,
)
from hexagent_gym.policy import run_policy
from tests.experiments.tiny_grid import TINY

ROOT = Path(__file__).resolve().parents[2]

# The variants the retired scripts/ablate_atlas.py built: (label in atlas_ablation.yaml,
# thresholds, beta), all with locality=False.
OLD_ABLATION = [
    ("atlas-default", (1.0, 4.0, 16.0), 4.0),
    ("atlas-finer", (0.5, 1.0, 2.0, 4.0, 8.0), 4.0),
    ("atlas-coarser", (4.0, 32.0), 4.0),
    ("atlas-beta1", (1.0, 4.0, 16.0), 1.0),
    ("atlas-beta16", (1.0, 4.0, 16.0), 16.0),
    ("atlas-no-starvation", (1.0, 4.0, 16.0), 1e9),
]


def test_entries_expand_with_merged_arguments_and_plain_names_are_unchanged():
    g = Grid(base=TINY, seeds=(0,), policies=(
        "fcfs", PolicySpec("atlas", "Atlas-NoLoc", {"locality": False}),
        PolicySpec("atlas", kwargs={"beta": 2.0})), policy_kwargs={"atlas": {"beta": 8.0}})
    fcfs, noloc, atlas = g.cells()
    assert g.labels == ("fcfs", "atlas-noloc", "atlas")
    assert fcfs == Cell("fcfs", TINY) and "label" not in fcfs.params
    assert noloc.label == "atlas-noloc" and noloc.params["label"] == "atlas-noloc"
    assert dict(noloc.policy_kwargs) == {"beta": 8.0, "locality": False}
    # an entry's own arguments win over policy_kwargs; a label equal to the name is no label
    assert dict(atlas.policy_kwargs) == {"beta": 2.0} and atlas.label == ""
    assert len({fcfs.key, noloc.key, atlas.key}) == 3
    assert noloc.describe().startswith("atlas-noloc (atlas) tiny-2p2d/bfcl_v3")


@pytest.mark.parametrize("policies, message", [
    (("atlas", PolicySpec("atlas", kwargs={"beta": 2.0})), "2 entries go by 'atlas'"),
    ((PolicySpec("atlas", "llf"),), "labelled 'llf', which is another registered policy"),
    ((PolicySpec("atlsa"),), "unknown policy 'atlsa'"),
])
def test_grid_rejects_ambiguous_labels(policies, message):
    with pytest.raises(ConfigError, match=message):
        Grid(base=TINY, policies=policies)


def test_labelled_entries_are_columns_of_the_tables():
    exp = Experiment("t", Grid(base=TINY, seeds=(0, 1), policies=(
        PolicySpec("atlas", "atlas-b1", {"beta": 1.0}), PolicySpec("atlas", "atlas-b4"))),
        Report(reference="atlas-b1", baselines=("atlas-b4",)))
    ev = evaluate(exp, None, progress=False, timing=False)
    rows = ev.summary()
    assert len(rows) == 1 and rows[0].policies == ["atlas-b1", "atlas-b4"]
    assert rows[0].best["req99"] == "atlas-b4" and rows[0].reduction["req99"] is not None
    assert "| atlas-b1 | atlas-b4 |" in format_table(rows, "req99", exp.report)
    assert summarize(ev.records, exp.report)[0].stats["atlas-b1"]["req99"].n == 2


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text("cluster: tiny-2p2d\nnum_workflows: 4\n" + text)
    return path


def test_yaml_entries_load(tmp_path):
    path = write(tmp_path, "grid:\n  policies:\n    - hexagent\n"
                 "    - {name: ATLAS, label: atlas-noloc, kwargs: {locality: false}}\n"
                 "  policy_kwargs: {atlas: {beta: 2.0}}\n"
                 "report: {reference: atlas-noloc, baselines: [hexagent]}\n")
    exp = load_experiment(path)
    assert exp.grid.policies == ("hexagent", PolicySpec("atlas", "atlas-noloc",
                                                        {"locality": False}))
    hx, noloc = exp.cells()
    assert hx == Cell("hexagent", EpisodeConfig(cluster="tiny-2p2d", num_workflows=4))
    assert dict(noloc.policy_kwargs) == {"beta": 2.0, "locality": False}
    assert exp.report.reference == "atlas-noloc"


@pytest.mark.parametrize("policies, expected", [
    ("[{name: atlas, lable: x}]", ["grid.policies[0]: unknown key 'lable'", "`label`"]),
    ("[hexagent, {label: x}]", ["grid.policies[1].name must be a registered policy name"]),
    ("[{name: atlsa}]", ["grid.policies[0].name: unknown policy 'atlsa'", "`atlas`"]),
    ("[{name: atlas, label: ''}]", ["grid.policies[0].label must be a non-empty string"]),
    ("[{name: atlas, kwargs: [1]}]", ["grid.policies[0].kwargs must be a mapping"]),
    ("[{name: atlas, kwargs: {betta: 2}}]", ["grid.policies[0].kwargs", "betta"]),
    ("[{name: atlas, kwargs: {beta: 1e9}}]", ["grid.policies[0].kwargs"]),  # YAML: a string
    ("[atlas, {name: atlas, kwargs: {beta: 2.0}}]", ["2 entries go by 'atlas'"]),
    ("[{name: atlas, label: llf}]", ["labelled 'llf', which is another registered policy"]),
    ("[3]", ["grid.policies[0] must be a policy name or a mapping with keys name, label"]),
    ("[]", ["grid.policies must be a non-empty list"]),
])
def test_bad_entries_name_the_file_and_field(tmp_path, policies, expected):
    path = write(tmp_path, f"grid: {{policies: {policies}}}\n")
    with pytest.raises(ConfigError) as err:
        load_experiment(path)
    assert str(path) in str(err.value)
    for part in expected:
        assert part in str(err.value)


def test_report_may_name_labels_only_of_the_grid(tmp_path):
    path = write(tmp_path, "grid: {policies: [{name: atlas, label: a1}]}\n"
                 "report: {reference: a2}\n")
    with pytest.raises(ConfigError, match="report: unknown policy 'a2'"):
        load_experiment(path)


def test_atlas_ablation_rows_equal_the_retired_scripts_runs():
    """Every labelled entry of atlas_ablation.yaml runs the ATLAS the old script built, in the
    old script's episode (no prefix cache, no parallel sampling), so the records match."""
    exp = load_experiment("atlas_ablation").with_overrides(num_workflows=30, seeds=[1],
                                                           loads=[1.2])
    assert list(exp.grid.labels) == [label for label, _, _ in OLD_ABLATION]
    factory = EpisodeFactory(EpisodeConfig(cluster="hetero-1", trace="bfcl_v3",
                                           num_workflows=30, load=1.2, prefix_cache=False,
                                           parallel_sampling=False))
    cells = exp.cells()
    assert {c.factory_config for c in cells} == {factory.config}
    for cell, (label, thresholds, beta) in zip(cells, OLD_ABLATION, strict=True):
        assert cell.label == label
        old = run_policy(factory.simulator(1), Atlas(thresholds, beta, locality=False))
        new = run_cell(cell, factory, timing=False)
        assert (new["metrics"]["req95"], new["metrics"]["req99"]) == (old.req95, old.req99)
        assert new["workflows"]["ratio"] == [float(x) for x in old.ratios]


def run_cli(*args):
    return subprocess.run([sys.executable, str(ROOT / "scripts/evaluate.py"), *args],
                          capture_output=True, text=True, cwd=ROOT)


def test_cli_runs_a_named_experiment_and_selects_entries_by_label(tmp_path):
    proc = run_cli("atlas_ablation", "--policies", "atlas-default,atlas-beta1", "--load", "1.2",
                   "--num-workflows", "20", "--seeds", "0", "--out", str(tmp_path), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "atlas_ablation: 2 cells" in proc.stderr
    assert "| atlas-default | atlas-beta1 |" in proc.stdout
    proc = run_cli("atlas_ablation", "--config", "table1", "--out", str(tmp_path))
    assert proc.returncode == 2 and "name the experiment once" in proc.stderr
