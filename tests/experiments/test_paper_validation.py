"""Paper validation: hand-made results and paper numbers give the right ratios, counts and
verdicts; the shipped data file loads with every field and a source; the report runs end to
end and holds a floor on the count within range."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from hexagent_gym.config import ConfigError
from hexagent_gym.experiments import load_experiment
from hexagent_gym.experiments.paper_report import format_report
from hexagent_gym.experiments.paper_tables import (
    PaperClaim,
    PaperTable,
    PaperTables,
    load_paper_tables,
)
from hexagent_gym.experiments.paper_validation import (
    AGREES,
    DIRECTION,
    DISAGREES,
    NOT_RUN,
    PART,
    cluster_patterns,
    evaluate_claim,
    evaluate_claims,
    our_rows,
    range_ratio,
    ratio,
    table_counts,
    total_within,
    within,
)
from hexagent_gym.scripts.validate_paper import main

ROOT = Path(__file__).resolve().parents[2]


def rec(policy, seed, req99, req95=None, cluster="c1", trace="t1", ms=None, label=""):
    """A cell record with only what the validation reads."""
    cell = {"policy": policy, "policy_kwargs": {}, "variant": "",
            "episode": {"cluster": cluster, "trace": trace, "num_workflows": 10,
                        "prefix_cache": False, "parallel_sampling": False, "seed": seed}}
    if label:
        cell["label"] = label
    out = {"key": f"{policy}{label}-{cluster}-{trace}-{seed}", "cell": cell,
           "metrics": {"req95": req99 if req95 is None else req95, "req99": req99}}
    if ms is not None:
        out["timing"] = {"scheduler_ms_per_invocation": ms}
    return out


def claim(kind="mean_reduction", **kw):
    base = {"id": kw.pop("id", f"x-{kind}"), "table": kw.pop("table", "t"), "kind": kind,
            "metric": kw.pop("metric", "req99"), "source": "arXiv 2605.16637, Table 9",
            "clusters": ("c1",), "traces": ("t1", "t2"), "models": ("m",)}
    if kind == "mean_reduction":
        base.update(reference="hexagent", baselines=("wf-fcfs", "llf", "atlas"))
    base.update(kw)
    return PaperClaim(**base)


# Row c1/t1 (seeds 0, 1): hexagent 1.5 on average; fcfs and atlas tie at 3.0; sglang-router
# 2.5 is the best baseline. Row c1/t2: hexagent 1.0, wf-fcfs 1.25 (the only baseline).
RECORDS = [
    rec("hexagent", 0, 1.0), rec("hexagent", 1, 2.0),
    rec("fcfs", 0, 3.0), rec("fcfs", 1, 3.0),
    rec("atlas", 0, 2.0), rec("atlas", 1, 4.0),
    rec("sglang-router", 0, 2.5), rec("sglang-router", 1, 2.5),
    rec("hexagent-nocache", 0, 0.5), rec("hexagent-nocache", 1, 0.5),  # not a baseline
    rec("hexagent", 0, 1.0, trace="t2"), rec("wf-fcfs", 0, 1.25, trace="t2"),
]


# -- ratios and the band ------------------------------------------------------------------------

def test_ratio_band_is_closed_at_0_8_and_1_25():
    assert ratio(3.0, 2.0) == 1.5 and ratio(1.0, 0.0) is None and ratio(None, 2.0) is None
    assert within(0.8) and within(1.25) and within(1.0)
    assert not within(0.79) and not within(1.26) and not within(None)


def test_range_ratio_is_to_the_nearer_end_and_one_inside():
    assert range_ratio(3.5, 7.0, 15.0) == 0.5
    assert range_ratio(30.0, 7.0, 15.0) == 2.0
    assert range_ratio(10.0, 7.0, 15.0) == 1.0 and range_ratio(None, 7.0, 15.0) is None


# -- mean reductions against the best shipped baseline ------------------------------------------

def test_mean_reduction_uses_the_best_of_every_shipped_baseline_run():
    rows = our_rows(RECORDS)
    # c1/t1: 1 - 1.5/2.5 = 0.4 (sglang-router); c1/t2: 1 - 1.0/1.25 = 0.2 -> mean 0.3
    o = evaluate_claim(claim(value=0.245), rows)
    assert o.ours == pytest.approx(0.3)
    assert o.ratio == pytest.approx(0.3 / 0.245)  # 1.224: inside the band
    assert o.verdict == AGREES and o.within and o.counted and o.rows_run == 2
    assert o.best == {("c1", "t1"): "sglang-router", ("c1", "t2"): "wf-fcfs"}
    # against the paper's own set (wf-fcfs, llf, atlas): c1/t1 atlas 3.0 -> 0.5; mean 0.35
    assert o.paper_set == pytest.approx(0.35)


def test_mean_reduction_verdicts_by_direction():
    rows = our_rows(RECORDS)
    assert evaluate_claim(claim(value=0.13), rows).verdict == DIRECTION  # 2.3x, same sign
    assert evaluate_claim(claim(value=-0.1), rows).verdict == DISAGREES  # opposite sign
    missing = evaluate_claim(claim(value=0.2, clusters=("nowhere",)), rows)
    assert missing.verdict == NOT_RUN and not missing.counted and missing.ours is None


def test_equal_baselines_go_to_the_first_shipped_name():
    # fcfs and atlas both 3.0 in c1/t1 once sglang-router is gone: fcfs is listed first
    rows = our_rows([r for r in RECORDS if r["cell"]["policy"] != "sglang-router"])
    assert rows[("c1", "t1")].best("req99", "hexagent") == ("fcfs", 3.0)


def test_patterns_name_the_best_baseline_per_row():
    pats = {(p.cluster, p.trace): p for p in cluster_patterns(RECORDS)}
    ref, best, best_mean, red = pats[("c1", "t1")].by_metric["req99"]
    assert (ref, best, best_mean) == (1.5, "sglang-router", 2.5) and red == pytest.approx(0.4)
    assert pats[("c1", "t2")].by_metric["req95"][1] == "wf-fcfs"


# -- order, cell and range claims ---------------------------------------------------------------

def order_records(pairs):
    out = []
    for i, (a, b) in enumerate(pairs):
        out += [rec("fcfs", 0, a, trace=f"t{i}"), rec("wf-fcfs", 0, b, trace=f"t{i}")]
    return out


@pytest.mark.parametrize("pairs, verdict, holds", [
    ([(3.0, 2.0), (2.0, 2.0), (1.0, 5.0)], PART, 1),   # holds, equal, reversed
    ([(3.0, 2.0), (4.0, 1.0), (2.0, 1.9)], AGREES, 3),
    ([(1.0, 2.0), (2.0, 2.0), (1.0, 5.0)], DISAGREES, 0),
])
def test_order_claims(pairs, verdict, holds):
    c = claim("order", above="fcfs", below="wf-fcfs", traces=("t0", "t1", "t2"))
    o = evaluate_claim(c, our_rows(order_records(pairs)))
    assert (o.verdict, o.holds, o.rows_run) == (verdict, holds, 3)
    assert not o.counted and o.ratio is None  # no number: never in the counts


def cell_claim(policy, value, trace="t1", **kw):
    return claim("cell", id=f"cell-{policy}-{trace}", policy=policy, value=value,
                 traces=(trace,), **kw)


def test_cell_claims_ratio_and_direction_against_the_rows_hexagent():
    rows = our_rows([rec("hexagent", 0, 1.0), rec("fcfs", 0, 3.0)])
    paper = [cell_claim("hexagent", 2.0), cell_claim("fcfs", 4.0)]
    fcfs = evaluate_claim(paper[1], rows, paper)
    # 3.0 / 4.0 = 0.75: outside; fcfs above hexagent in both -> direction
    assert fcfs.ratio == 0.75 and fcfs.verdict == DIRECTION
    hexa = evaluate_claim(paper[0], rows, paper)
    # 1.0 / 2.0 = 0.5; hexagent below the best baseline in both -> direction
    assert hexa.ratio == 0.5 and hexa.verdict == DIRECTION
    close = evaluate_claim(cell_claim("fcfs", 3.2), rows, [paper[0]])
    assert close.ratio == pytest.approx(0.9375) and close.verdict == AGREES
    alone = evaluate_claim(cell_claim("fcfs", 10.0), rows)  # no paper cell to take a side
    assert alone.verdict == DISAGREES and "direction" in alone.note
    flipped = evaluate_claim(cell_claim("fcfs", 4.0), rows, [cell_claim("hexagent", 5.0)])
    assert flipped.verdict == DISAGREES  # paper: fcfs below hexagent; ours: above


def test_range_claims_compare_with_the_nearer_end():
    c = claim("range", policy="hexagent", metric="scheduler_ms_per_invocation", low=7.0,
              high=15.0, traces=("t1",))
    slow = our_rows([rec("hexagent", 0, 1.0, ms=5.0), rec("hexagent", 1, 1.0, ms=7.0)])
    o = evaluate_claim(c, slow)
    assert o.ours == 6.0 and o.ratio == pytest.approx(6 / 7) and o.verdict == AGREES
    fast = evaluate_claim(c, our_rows([rec("hexagent", 0, 1.0, ms=0.7)]))
    assert fast.ratio == pytest.approx(0.1) and fast.verdict == DISAGREES


def test_counts_per_table_count_numbers_that_ran_and_those_within():
    tables = PaperTables("arXiv 2605.16637", (
        PaperTable("a", "A", "exp", (claim(id="a1", table="a", value=0.245),    # within
                                     claim(id="a2", table="a", value=0.13),     # outside
                                     claim("order", id="a3", table="a", above="fcfs",
                                           below="hexagent"))),
        PaperTable("b", "B", "none", (claim(id="b1", table="b", value=0.3),)),  # not run
    ))
    outcomes = evaluate_claims(tables, {"exp": RECORDS})
    counts = {c.table: (c.numbers, c.run, c.within) for c in table_counts(tables, outcomes)}
    assert counts == {"a": (2, 2, 1), "b": (1, 0, 0)}
    assert total_within(outcomes) == 1
    text = format_report(tables, {"exp": RECORDS}, outcomes)
    assert "Within 0.8–1.25×: 1 of 2 paper numbers run (3 in the data file)." in text
    assert "sglang-router 1, wf-fcfs 1" in text  # the best baseline is named per row


# -- the shipped data file ------------------------------------------------------------------------

def test_data_file_loads_with_every_field_and_a_source():
    tables = load_paper_tables()  # also checks each cluster's model against the claim's
    assert tables.paper == "arXiv 2605.16637"
    claims = tables.claims()
    assert claims and len({c.id for c in claims}) == len(claims)
    for c in claims:
        assert re.fullmatch(r"arXiv 2605\.16637, Tables? \d(-\d)?", c.source), c.source
        assert c.quoted_in and c.metric and c.clusters and c.traces and c.models
        if c.kind == "mean_reduction":
            assert c.value is not None and c.reference == "hexagent" and c.baselines
        if c.kind == "range":
            assert 0 < c.low <= c.high
    for t in tables.tables:
        assert t.missing, f"{t.name}: say what the repository does not state"


def test_every_paper_number_is_one_the_results_page_states():
    results = (ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8")
    for c in load_paper_tables().claims():
        if c.kind == "mean_reduction":
            assert f"{100 * c.value:g}%" in results, c.id
        if c.kind == "range":
            assert f"{c.low:g}–{c.high:g} ms" in results, c.id


def test_paper_experiments_cover_the_claims_under_the_preset():
    tables = load_paper_tables()
    rates = {"sharegpt": (100, 10.0), "bfcl_v3": (400, 40.0), "lats": (100, 40.0),
             "mixed": (100, 10.0)}
    for t in tables.tables:
        if not t.claims:
            continue
        exp = load_experiment(t.experiment)
        cells = exp.cells()
        assert len({c.episode.seed for c in cells}) >= 5
        for c in cells:
            e = c.episode
            assert (e.prefix_cache, e.parallel_sampling) == (False, False)
            assert (e.num_workflows, e.arrival_rate) == rates[e.trace]
        ran = {(c.episode.cluster, c.episode.trace, c.policy) for c in cells}
        for claim_ in t.claims:
            policies = ({claim_.above, claim_.below} if claim_.kind == "order"
                        else {claim_.reference} if claim_.kind == "mean_reduction"
                        else {claim_.policy})
            for cluster, trace in claim_.rows:
                for p in policies:
                    assert (cluster, trace, p) in ran, (claim_.id, cluster, trace, p)


@pytest.mark.parametrize("change, message", [
    (lambda c: c.pop("source"), "missing key 'source'"),
    (lambda c: c.update(sourse="x"), "unknown key 'sourse'"),
    (lambda c: c.update(source="RESULTS.md"), "cite the paper"),
    (lambda c: c.update(clusters=["qwen-hetero-1"]), "runs model 'qwen3-235b-a22b'"),
    (lambda c: c.update(value=13), "a fraction"),
    (lambda c: c.update(kind="celll"), "kind: expected one of"),
])
def test_bad_entries_name_the_entry(tmp_path, change, message):
    entry = {"id": "a", "kind": "mean_reduction", "metric": "req99", "value": 0.13,
             "reference": "hexagent", "baselines": ["llf"], "models": ["llama-3.1-70b"],
             "clusters": ["hetero-1"], "traces": ["bfcl_v3"], "quoted_in": "docs",
             "source": "arXiv 2605.16637, Table 2"}
    change(entry)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"paper": "arXiv 2605.16637", "tables": {
        "t": {"title": "T", "experiment": "paper_table1", "claims": [entry]}}}))
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        load_paper_tables(path)
    assert "tables.t.claims[0]" in str(err.value)


# -- the command line ---------------------------------------------------------------------------

def test_quick_report_runs_end_to_end(tmp_path, capsys):
    out = tmp_path / "runs"
    argv = ["--quick", "--num-workflows", "8", "--out", str(out), "--quiet"]
    assert main([*argv, "--min-within", "0"]) == 0
    text = capsys.readouterr().out
    assert "### Every paper number, side by side" in text
    assert "table2_3-mean-reduction-req99" in text and "Per-cluster reduction patterns" in text
    assert (out / "validation.md").read_text() == text
    # paper_table2_3 reuses paper_table1's quick cells: same records, same keys
    t1 = json.loads((out / "paper_table1" / "results.json").read_text())["cells"]
    t23 = json.loads((out / "paper_table2_3" / "results.json").read_text())["cells"]
    assert {r["key"] for r in t23} <= {r["key"] for r in t1}
    # reading the runs back gives the same report; a floor above the count fails
    assert main(["--from", str(out), "--min-within", "0"]) == 0
    assert capsys.readouterr().out == text
    assert main(["--from", str(out), "--min-within", "99"]) == 1
    assert "below the floor --min-within 99" in capsys.readouterr().err


def test_min_within_floor_on_hand_made_results(tmp_path, capsys):
    paper = tmp_path / "paper.yaml"
    mr = {"kind": "mean_reduction", "metric": "req99", "reference": "hexagent",
          "baselines": ["wf-fcfs"], "models": ["llama-3.1-70b"], "clusters": ["hetero-1"],
          "traces": ["t1", "t2"], "source": "arXiv 2605.16637, Table 2", "quoted_in": "here"}
    paper.write_text(yaml.safe_dump({"paper": "arXiv 2605.16637", "tables": {"t": {
        "title": "T", "experiment": "exp", "claims": [
            {**mr, "id": "in", "value": 0.245},     # ours 0.3: 1.22x, within
            {**mr, "id": "out", "value": 0.13}]}}}))  # 2.3x: outside
    records = [{**r, "cell": {**r["cell"], "episode": {**r["cell"]["episode"],
                                                       "cluster": "hetero-1"}}}
               for r in RECORDS]
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "results.json").write_text(json.dumps({"experiment": "exp",
                                                               "cells": records}))
    base = ["--paper", str(paper), "--from", str(tmp_path)]
    assert main([*base, "--min-within", "1"]) == 0
    assert "Within 0.8–1.25×: 1 of 2" in capsys.readouterr().out
    assert main([*base, "--min-within", "2"]) == 1
    assert main([*base, "--tables", "nope"]) == 2
    assert "unknown paper table 'nope'" in capsys.readouterr().err
