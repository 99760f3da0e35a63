"""The evaluation layer: grid expansion, table math, determinism, resume, config errors, CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from hexagent_gym.config import ConfigError, configs_dir
from hexagent_gym.episode import EpisodeConfig, EpisodeFactory
from hexagent_gym.experiments import (
    CELLS_FILE,
    FAILURES_FILE,
    Cell,
    CellFailure,
    FactoryCache,
    Grid,
    Report,
    Stat,
    evaluate,
    format_failures,
    format_table,
    load_experiment,
    mean_reduction,
    read_cells,
    results_json,
    run_cell,
    run_cells,
    size_split,
    summarize,
    t_quantile_975,
    write_results,
)
from tests.experiments.tiny_grid import TINY, tiny_experiment

ROOT = Path(__file__).resolve().parents[2]


def fake(policy, seed, req99, req95=None, cluster="c", trace="t"):
    """A record as run_cell writes it, with only what the tables read."""
    episode = {**EpisodeConfig(cluster=cluster, trace=trace).__dict__, "seed": seed}
    return {"cell": {"policy": policy, "policy_kwargs": {}, "variant": "", "episode": episode},
            "offered_load": 1.0, "arrival_rate": 2.0,
            "metrics": {"req95": req95 if req95 is not None else req99, "req99": req99,
                        "mean_ratio": 1.0, "max_ratio": req99}}


def without_timing(records):
    return [{k: v for k, v in r.items() if k != "timing"} for r in records]


# -- table math -----------------------------------------------------------------------------------

def test_mean_and_student_t_interval_by_hand():
    s = Stat.of([1.0, 2.0, 3.0])  # mean 2, sample sd 1, t_{0.975,2} = 4.303
    assert s.mean == 2.0 and s.n == 3
    assert s.ci == pytest.approx(4.303 / math.sqrt(3))
    one = Stat.of([1.7])
    assert one.mean == 1.7 and math.isnan(one.ci) and one.format() == "1.70"
    assert Stat.of([2.0, 4.0]).format() == f"3.00 ± {12.706 * math.sqrt(2) / math.sqrt(2):.2f}"
    assert t_quantile_975(1) == 12.706 and t_quantile_975(30) == 2.042
    assert t_quantile_975(10_000) == 1.960


def test_reduction_is_against_the_lowest_mean_baseline_of_the_configured_set():
    recs = []
    for seed, (hx, wf, llf, atlas, fcfs) in enumerate([(1.0, 3.0, 2.0, 2.5, 1.05),
                                                       (1.2, 3.0, 2.4, 2.5, 1.15)]):
        recs += [fake("hexagent", seed, hx), fake("wf-fcfs", seed, wf), fake("llf", seed, llf),
                 fake("atlas", seed, atlas), fake("fcfs", seed, fcfs)]
    # A second row (other trace) where hexagent is worse than the best baseline.
    recs += [fake("hexagent", 0, 3.0, trace="u"), fake("atlas", 0, 2.0, trace="u")]
    rows = summarize(recs, Report(baselines=("wf-fcfs", "llf", "atlas")))
    assert len(rows) == 2
    row = rows[0]
    assert row.stats["llf"]["req99"].mean == pytest.approx(2.2)
    assert row.best["req99"] == "llf"  # fcfs (1.1) is lower but not a configured baseline
    assert row.reduction["req99"] == pytest.approx(1 - 1.1 / 2.2)
    # Paired over seeds: 1 − 1.0/2.0 and 1 − 1.2/2.4, both 0.5, so no spread.
    assert row.paired["req99"].mean == pytest.approx(0.5) and row.paired["req99"].n == 2
    assert row.paired["req99"].ci == pytest.approx(0.0)
    assert rows[1].best["req99"] == "atlas"
    assert rows[1].reduction["req99"] == pytest.approx(1 - 3.0 / 2.0)
    assert mean_reduction(rows, "req99") == pytest.approx((0.5 - 0.5) / 2)
    text = format_table(rows, "req99", Report())
    assert "50.0%" in text and "-50.0%" in text and "1.10 ± " in text
    assert "| c | t |" in text and "| llf |" in text and "| 50.0% ± 0.0 |" in text
    # Without the reference or any baseline there is no reduction.
    rows = summarize([fake("fcfs", 0, 2.0)], Report())
    assert rows[0].reduction["req99"] is None and rows[0].best["req99"] is None


def test_size_split_separates_small_and_large_workflows():
    rec = {"workflows": {"ratio": [1.0, 5.0, 2.0, 3.0], "num_calls": [2, 2, 7, 9]}}
    split = size_split(rec, 2)
    assert split["small"] == {"n": 2, "req95": 5.0, "req99": 5.0}
    assert split["large"]["n"] == 2 and split["large"]["req99"] == 3.0


# -- grids ----------------------------------------------------------------------------------------

def test_grid_expansion_and_precedence():
    g = Grid(base=TINY, policies=("hexagent", "fcfs"), traces=("bfcl_v3", "sharegpt"),
             seeds=(0, 1), per_trace={"sharegpt": {"load": 2.0, "num_workflows": 4}},
             variants=(("a", {}), ("k1", {"max_calls_per_decision": 1})))
    cells = g.cells()
    assert len(cells) == 2 * 2 * 2 * 2
    assert len({c.key for c in cells}) == len(cells)
    share = [c for c in cells if c.episode.trace == "sharegpt"]
    assert {c.episode.load for c in share} == {2.0} and {c.episode.num_workflows
                                                         for c in share} == {4}
    assert {c.episode.max_calls_per_decision for c in cells if c.variant == "k1"} == {1}
    # Cells sharing a factory are adjacent: policies and seeds innermost.
    assert [c.policy for c in cells[:4]] == ["hexagent", "fcfs"] * 2
    # A swept load wins over the per-trace one.
    swept = Grid(base=TINY, traces=("sharegpt",), loads=(0.5,),
                 per_trace={"sharegpt": {"load": 2.0}}).cells()
    assert {c.episode.load for c in swept} == {0.5}
    # Keys are canonical: an int load equals the float one.
    assert Cell("fcfs", TINY.replace(load=1)).key == Cell("fcfs", TINY.replace(load=1.0)).key


def test_overrides_quick_and_num_workflows():
    exp = load_experiment("table1")
    quick = exp.with_overrides(quick=True)
    assert quick.grid.seeds == (0,)
    assert {c.episode.num_workflows for c in quick.cells()} == {50}
    small = exp.with_overrides(num_workflows=7, traces=["lats"], policies=["HexAgent"])
    cells = small.cells()
    assert {c.episode.num_workflows for c in cells} == {7}
    assert {c.policy for c in cells} == {"hexagent"} and {c.episode.trace for c in cells} == {
        "lats"}


@pytest.mark.parametrize("path", sorted((configs_dir() / "experiments").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_shipped_experiments_load(path):
    exp = load_experiment(path)
    assert exp.name == path.stem and exp.cells()


# -- running cells --------------------------------------------------------------------------------

def test_run_cell_is_a_pure_function_of_the_cell():
    cell = Cell("hexagent", TINY.replace(seed=3))
    shared = EpisodeFactory(cell.factory_config)
    a = run_cell(cell, timing=False)
    b = run_cell(cell, shared, timing=False)
    assert a == b
    assert a["key"] == cell.key and a["metrics"]["num_workflows"] == 6
    assert len(a["workflows"]["ratio"]) == 6 and min(a["workflows"]["ratio"]) >= 0.99
    assert a["offered_load"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="factory"):
        run_cell(Cell("hexagent", TINY.replace(load=0.5)), shared)


def test_same_grid_twice_gives_identical_json(tmp_path):
    exp = tiny_experiment()
    a = evaluate(exp, tmp_path / "a", progress=False, timing=False)
    b = evaluate(exp, tmp_path / "b", progress=False, timing=False)
    write_results(a, tmp_path / "a")
    write_results(b, tmp_path / "b")
    assert (tmp_path / "a/results.json").read_bytes() == (tmp_path / "b/results.json").read_bytes()
    assert (tmp_path / "a/tables.md").read_bytes() == (tmp_path / "b/tables.md").read_bytes()
    # With wall-clock timings on, everything else is still identical.
    c = evaluate(exp, None, progress=False)
    assert all("timing" in r for r in c.records)
    assert without_timing(c.records) == a.records
    data = results_json(a)
    assert len(data["cells"]) == 4 and len(data["rows"]) == 1
    assert len(data["cells"][0]["workflows"]["ratio"]) == 6


def test_resume_skips_finished_cells_and_survives_a_torn_line(tmp_path):
    first = evaluate(tiny_experiment(policies=("hexagent",)), tmp_path, progress=False)
    assert (first.computed, first.reused) == (2, 0)
    path = tmp_path / CELLS_FILE
    assert len(path.read_text().splitlines()) == 2
    with path.open("a") as f:  # an interrupted write
        f.write('{"schema": 1, "key": "abc", "cell"')
    bigger = tiny_experiment(policies=("hexagent", "fcfs"))
    second = evaluate(bigger, tmp_path, resume=True, progress=False)
    assert (second.computed, second.reused) == (2, 2)
    lines = path.read_text().splitlines()
    assert len(lines) == 4 and all(json.loads(x) for x in lines)
    # The reused records are the stored ones, byte for byte (timings included).
    assert second.records[0] == first.records[0]
    assert len(read_cells(path)) == 4
    third = evaluate(bigger, tmp_path, resume=True, progress=False)
    assert (third.computed, third.reused) == (0, 4)
    # Without --resume the file starts afresh.
    fresh = evaluate(tiny_experiment(policies=("fcfs",), seeds=(0,)), tmp_path, progress=False)
    assert fresh.computed == 1 and len(path.read_text().splitlines()) == 1


def test_worker_processes_give_the_same_records():
    exp = tiny_experiment(seeds=(0,), traces=("bfcl_v3", "sharegpt"))
    one = evaluate(exp, None, progress=False, timing=False)
    two = evaluate(exp, None, progress=False, timing=False, workers=2)
    assert one.records == two.records


def test_a_single_factory_group_is_split_across_worker_processes(monkeypatch):
    """One cluster, trace and load with many seeds is one factory group; the pool still gets one
    task per chunk (about two per worker), and the records equal the serial run's."""
    from hexagent_gym.experiments import chunks, runner

    exp = tiny_experiment(seeds=(0, 1, 2, 3), policies=("fcfs", "hexagent"))
    groups = list(chunks.factory_groups(exp.cells()))
    assert len(groups) == 1
    sizes = [len(c) for c in chunks.chunk_cells(groups, chunks.auto_chunk_size(groups, 2))]
    assert sizes == [2, 2, 2, 2]
    submitted = []
    real = chunks.chunk_cells

    def spy(groups, chunk_size):
        chunks = real(groups, chunk_size)
        submitted.append([len(c) for c in chunks])
        return chunks

    monkeypatch.setattr(runner, "chunk_cells", spy)
    two = evaluate(exp, None, progress=False, timing=False, workers=2)
    one = evaluate(exp, None, progress=False, timing=False)
    assert submitted == [[2, 2, 2, 2]]  # the pool got four tasks, not one
    assert one.records == two.records


def test_a_failing_cell_is_reported_with_its_parameters_and_the_others_are_kept(tmp_path):
    # llf rejects the argument when the cell builds it; hexagent's cells are unaffected.
    exp = tiny_experiment(policies=("hexagent", "llf"), policy_kwargs={"llf": {"bogus": 1}})
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        ev = evaluate(exp, out, progress=False, timing=False, workers=workers)
        assert not ev.complete and ev.computed == 2 and len(ev.records) == 2
        assert {r["cell"]["policy"] for r in ev.records} == {"hexagent"}
        assert [(f.cell["policy"], f.cell["episode"]["seed"]) for f in ev.failures] == [
            ("llf", 0), ("llf", 1)]
        assert all("unexpected keyword argument 'bogus'" in f.error for f in ev.failures)
        assert len((out / CELLS_FILE).read_text().splitlines()) == 2
        assert len((out / FAILURES_FILE).read_text().splitlines()) == 2
    text = format_failures(ev.failures, 4)
    assert text.splitlines()[0].startswith("2 of 4 cells failed")
    assert "FAILED llf tiny-2p2d/bfcl_v3 ρ=1 seed 0 [key " in text
    assert '"policy_kwargs": {"bogus": 1}' in text and "error: TypeError: " in text
    # Serial and fail-fast: the cell's own exception propagates.
    with pytest.raises(TypeError, match="bogus"):
        evaluate(exp, None, progress=False, fail_fast=True)
    # A resumed run retries the failed cells only, and a clean run removes failures.jsonl.
    again = evaluate(exp, tmp_path / "w1", resume=True, progress=False, timing=False)
    assert (again.computed, again.reused, len(again.failures)) == (0, 2, 2)
    evaluate(tiny_experiment(policies=("hexagent",)), tmp_path / "w1", resume=True,
             progress=False)
    assert not (tmp_path / "w1" / FAILURES_FILE).exists()


def test_run_cells_catches_per_cell_and_shares_factories():
    good, bad = Cell("fcfs", TINY), Cell("fcfs", TINY, (("bogus", 1),))
    with pytest.raises(TypeError):
        run_cells([good, bad])
    out = run_cells([bad, good], timing=False, catch=True)
    assert isinstance(out[0], CellFailure) and out[0].key == bad.key
    assert out[1] == run_cell(good, timing=False)
    # A cache passed in is the one used, also while still empty (a worker's first task).
    cache = FactoryCache(2)
    other = Cell("hexagent", TINY.replace(load=0.5))
    run_cells([good, Cell("hexagent", TINY.replace(seed=1)), other, good],
              timing=False, factories=cache)
    assert (cache.misses, cache.hits, len(cache)) == (2, 2, 2)


def test_ray_is_optional():
    """Importing the evaluation layer (or the Ray backend module) does not import ray, and
    asking for the Ray backend without ray says how to install it."""
    code = ("import sys; import hexagent_gym.experiments, hexagent_gym.experiments.plots, "
            "hexagent_gym.experiments.ray_backend; import hexagent_gym.scripts.evaluate; "
            "assert 'ray' not in sys.modules, 'ray imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    code = ("import sys; sys.modules['ray'] = None\n"
            "from hexagent_gym.experiments import Experiment, Grid, evaluate\n"
            "from hexagent_gym.episode import EpisodeConfig\n"
            "exp = Experiment('x', Grid(base=EpisodeConfig(cluster='tiny-2p2d', "
            "num_workflows=2), policies=('fcfs',)))\n"
            "evaluate(exp, None, backend='ray', progress=False)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT)
    assert proc.returncode != 0
    assert 'pip install "hexagent-gym[distributed]"' in proc.stderr


def test_chunks_split_factory_groups():
    from hexagent_gym.experiments import auto_chunk_size, chunk_cells

    cells = tiny_experiment(seeds=(0, 1, 2, 3, 4), traces=("bfcl_v3", "sharegpt")).cells()
    groups = [cells[:10], cells[10:]]
    assert chunk_cells(groups, None) == groups and chunk_cells(groups, 0) == groups
    four = chunk_cells(groups, 4)
    assert [len(c) for c in four] == [3, 4, 3, 3, 4, 3]
    assert [c for ch in four for c in ch] == cells
    assert all(len({c.factory_config for c in ch}) == 1 for ch in four)
    assert [len(c) for c in chunk_cells(groups, 1)] == [1] * 20
    # Auto: whole groups while there are two per CPU, else about two tasks per CPU.
    assert auto_chunk_size(groups, cpus=1) == 0
    assert auto_chunk_size(groups, cpus=2) == 5 and auto_chunk_size(groups, cpus=64) == 1


# -- config errors --------------------------------------------------------------------------------

def write(tmp_path, text: str) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, expected", [
    ("grdi: {}\n", ["unknown key 'grdi'", "Did you mean: `grid`"]),
    ("num_workflow: 5\n", ["unknown key 'num_workflow'", "`num_workflows`"]),
    ("load: -1\n", ["load must be a finite number > 0"]),
    ("grid: {polices: [fcfs]}\n", ["grid: unknown key 'polices'", "`policies`"]),
    ("grid: {policies: [fcfss]}\n", ["unknown policy 'fcfss'", "`fcfs`"]),
    ("grid: {clusters: [hetero-3]}\n", ["grid.clusters", "unknown cluster 'hetero-3'"]),
    ("grid: {traces: [bfcl]}\ngrid2: 1\n", ["unknown key 'grid2'"]),
    ("grid: {traces: [nope]}\n", ["grid.traces"]),
    ("grid: {seeds: [0, x]}\n", ["grid.seeds must be a non-empty list of integers"]),
    ("grid: {traces: [lats], per_trace: {lats: {num_workflow: 3}}}\n",
     ["grid.per_trace.lats: unknown key 'num_workflow'"]),
    ("grid: {traces: [lats], per_trace: {lats: {load: 0}}}\n",
     ["grid.per_trace.lats", "load must be a finite number > 0"]),
    ("grid: {traces: [lats], per_trace: {lat: {load: 1}}}\n",
     ["grid.per_trace: 'lat' is not one of the grid's traces", "`lats`"]),
    ("grid: {policy_kwargs: {atlas: {betta: 2}}}\n", ["grid.policy_kwargs.atlas", "betta"]),
    ("report: {metrics: [req98]}\n", ["report.metrics: unknown metric 'req98'"]),
    ("report: {baseline: [llf]}\n", ["report: unknown key 'baseline'", "`baselines`"]),
    ("report: {by_size: 0}\n", ["report.by_size"]),
])
def test_bad_config_names_the_file_and_key(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_experiment(path)
    msg = str(err.value)
    assert str(path) in msg
    for part in expected:
        assert part in msg


# -- CLI ------------------------------------------------------------------------------------------

def run_cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(ROOT / "scripts/evaluate.py"), *args],
                          capture_output=True, text=True, cwd=cwd)


def test_cli_smoke_writes_tables_results_and_plots(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("--clusters", "tiny-2p2d", "--traces", "bfcl_v3", "--num-workflows", "6",
                   "--policies", "hexagent,fcfs", "--seeds", "0,1", "--load", "0.8,1.2",
                   "--out", str(out), "--plot", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "| hexagent | fcfs |" in proc.stdout and "req99" in proc.stdout
    data = json.loads((out / "results.json").read_text())
    assert len(data["cells"]) == 8 and len(data["rows"]) == 2
    assert len((out / CELLS_FILE).read_text().splitlines()) == 8
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["experiment_attainment_tiny-2p2d.png",
                    "experiment_load_sweep_tiny-2p2d_bfcl_v3_n6.png"]
    assert all((out / p).stat().st_size > 10_000 for p in pngs)
    again = run_cli("--clusters", "tiny-2p2d", "--traces", "bfcl_v3", "--num-workflows", "6",
                    "--policies", "hexagent,fcfs", "--seeds", "0,1", "--load", "0.8,1.2",
                    "--out", str(out), "--resume", "--quiet")
    assert again.returncode == 0 and "0 cells run, 8 reused" in again.stderr


def test_cli_ray_flags_need_the_ray_backend(tmp_path):
    proc = run_cli("--address", "127.0.0.1:6379", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "--address needs --backend ray" in proc.stderr
    proc = run_cli("--backend", "ray", "--address", "auto", "--workers", "2")
    assert proc.returncode == 2 and "--workers sizes a local Ray instance" in proc.stderr


def test_cli_reports_config_errors_with_exit_code_2(tmp_path):
    path = write(tmp_path, "grid: {polices: [fcfs]}\n")
    proc = run_cli("--config", str(path), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2
    assert "polices" in proc.stderr and str(path) in proc.stderr
    proc = run_cli("--policies", "nope", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "unknown policy 'nope'" in proc.stderr
