"""scripts/count_instructions.py: valgrind's total parsed, the children's workloads, the
difference per unit, and clear errors (the valgrind runs themselves take minutes: not here)."""

from __future__ import annotations

import gc
import subprocess
from types import SimpleNamespace

import pytest

from hexagent_gym.config import ConfigError
from hexagent_gym.envs.pd_cluster_env import PDClusterEnv
from hexagent_gym.scripts import count_instructions as ci


def test_instructions_from_reads_the_total_and_says_what_is_missing():
    report = "==9== Cachegrind, a cache and branch-prediction profiler\n==9==\n" \
             "==9== I   refs:      5,185,067,938\n"
    assert ci.instructions_from(report) == 5_185_067_938
    with pytest.raises(ValueError, match="(?s)no 'I refs:' line.*valgrind: command failed"):
        ci.instructions_from("valgrind: command failed\n")


def test_misses_from_reads_the_l1_data_and_last_level_totals():
    report = ("==7== I   refs:      16,892,506,879\n"
              "==7== I1  misses:          1,208,144\n"
              "==7== LLi misses:             40,105\n"
              "==7== D1  misses:       273,840,869  (   246,756,834 rd   +    27,084,035 wr)\n"
              "==7== LLd misses:        23,084,098  (    19,542,768 rd   +     3,541,330 wr)\n"
              "==7== LL misses:         23,124,203  (    19,582,873 rd   +     3,541,330 wr)\n")
    assert ci.misses_from(report) == {"L1 data misses": 273_840_869,
                                      "last-level misses": 23_124_203}
    with pytest.raises(ValueError, match=r"no 'D1 misses:' line .*was the cache simulated"):
        ci.misses_from("==7== I   refs:      16,892,506,879\n")


@pytest.mark.parametrize("what", ["step", "rollout", "first"])
def test_children_run_the_measured_part_only_when_asked(what, capsys):
    flags = ["--num-workflows", "10", "--steps", "25"]
    assert ci.main([what, "--child", "0", *flags]) == 0
    assert capsys.readouterr().out.split() == ["units", "0"]
    assert ci.main([what, "--child", "1", *flags]) == 0
    units = int(capsys.readouterr().out.split()[-1])
    if what == "step":
        assert units == 25
    else:  # one whole rollout: its simulated calls
        env = PDClusterEnv(cluster="hetero-1", trace="bfcl_v3", num_workflows=10, load=1.0,
                           seed=0)
        assert units == env.rollout("hexagent").num_calls > 0
    assert gc.isenabled()  # the child's pause of the collector ends with the measured part


def test_children_run_under_cachegrind_with_one_blas_thread():
    ns = SimpleNamespace(what="first", cluster="hetero-1-x8", trace="bfcl_v3",
                         num_workflows=3200, load=1.0, policy="hexagent", steps=4000, seed=3)
    cmd = ci.child_command(ns, 1)
    assert cmd[:4] == ["valgrind", "--tool=cachegrind", "--cache-sim=no",
                       "--cachegrind-out-file=/dev/null"]
    assert cmd[cmd.index("--child") + 1] == "1" and "hetero-1-x8" in cmd and "3200" in cmd
    with_misses = ci.child_command(SimpleNamespace(**vars(ns), misses=True), 1)
    assert with_misses[:6] == ["valgrind", "--tool=cachegrind", "--cache-sim=yes",
                               "--I1=32768,8,64", "--D1=32768,8,64", "--LL=1048576,8,64"]
    assert with_misses[6:] == cmd[3:]  # the same child otherwise
    env = ci.child_env()
    assert env["OPENBLAS_NUM_THREADS"] == "1" and env["PYTHONHASHSEED"] == "0"
    assert env["PYTHONPATH"].split(":")[0] == str(ci.ROOT)


def test_count_is_the_difference_per_unit(monkeypatch, capsys):
    runs = []

    def fake_run(cmd, **kwargs):
        run = int(cmd[cmd.index("--child") + 1])
        runs.append(run)
        total = "1,600,000" if run else "1,000,000"
        d1, ll = ("9,000", "1,200") if run else ("6,000", "600")
        return subprocess.CompletedProcess(
            cmd, 0, stdout=f"units {300 * run}\n", stderr=f"==1== I   refs:      {total}\n"
            f"==1== D1  misses:      {d1}  (1 rd + 1 wr)\n==1== LL misses:      {ll}  (1 rd)\n")

    monkeypatch.setattr(ci.shutil, "which", lambda name: "/usr/bin/valgrind")
    monkeypatch.setattr(ci.subprocess, "run", fake_run)
    args = SimpleNamespace(what="step", cluster="hetero-1", trace="bfcl_v3", num_workflows=400,
                           load=1.0, policy="hexagent", steps=300, seed=0)
    assert ci.count(args) == ({"instructions": 2000.0}, 300)
    assert runs == [0, 1]
    assert ci.count(SimpleNamespace(**vars(args), misses=True)) == (
        {"instructions": 2000.0, "L1 data misses": 10.0, "last-level misses": 2.0}, 300)
    monkeypatch.setattr(ci, "check_inputs", lambda args: None)
    assert ci.main(["step", "--steps", "300", "--misses"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "step on hetero-1 / bfcl_v3, 400 workflows: 2,000 instructions per env step (over 300 "
        "of them; valgrind, one BLAS thread)",
        "  cache model L1 data 32 KB 8-way, last level 1 MB 8-way: 10.0 L1 data misses, 2.0 "
        "last-level misses per env step"]


def test_clear_errors(monkeypatch, capsys):
    args = SimpleNamespace(what="rollout", cluster="hetero-1", trace="bfcl_v3",
                           num_workflows=400, load=1.0, policy="hexagent", steps=1, seed=0)
    monkeypatch.setattr(ci.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit, match="valgrind is not on PATH"):
        ci.count(args)
    monkeypatch.setattr(ci.shutil, "which", lambda name: "/usr/bin/valgrind")
    monkeypatch.setattr(ci.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, stdout="", stderr="Traceback ...\nConfigError: unknown cluster 'nope'\n"))
    failed = r"(?s)run 0\) failed with exit code 1:.*unknown cluster 'nope'"
    monkeypatch.setattr(ci, "check_inputs", lambda args: None)  # as if the input were valid
    with pytest.raises(SystemExit, match=failed):
        ci.count(args)
    monkeypatch.undo()
    monkeypatch.setattr(ci.shutil, "which", lambda name: "/usr/bin/valgrind")
    monkeypatch.setattr(ci.subprocess, "run", lambda cmd, **kw: pytest.fail("spawned a child"))
    with pytest.raises(ConfigError, match="nope"):  # bad input fails before any child
        ci.count(SimpleNamespace(**{**vars(args), "cluster": "nope"}))
    with pytest.raises(ValueError, match="unknown.*hexagentt|hexagentt"):
        ci.count(SimpleNamespace(**{**vars(args), "policy": "hexagentt"}))
    assert ci.main(["rollout", "--policy", "hexagentt"]) == 2  # one line, no traceback
    assert "error: unknown policy 'hexagentt'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ci.main(["step", "--steps", "0"])
    with pytest.raises(SystemExit):
        ci.main(["walk"])
    with pytest.raises(SystemExit):  # a cache model without --misses would be ignored
        ci.main(["rollout", "--cache-model", "host"])
    assert "--cache-model chooses the cache model of --misses" in capsys.readouterr().err


def _sysfs(root, caches):
    """A fake /sys/devices/system/cpu/cpu0/cache: one index directory per (level, type, size,
    ways, line)."""
    for i, (level, kind, size, ways, line) in enumerate(caches):
        index = root / f"index{i}"
        index.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size),
                            ("ways_of_associativity", ways), ("coherency_line_size", line)):
            (index / name).write_text(f"{value}\n")
    return root


def test_host_cache_model_reads_the_cores_own_caches(tmp_path, monkeypatch):
    root = _sysfs(tmp_path, [(1, "Data", "48K", 12, 64), (1, "Instruction", "64K", 16, 64),
                             (2, "Unified", "2048K", 16, 64), (3, "Unified", "480M", 16, 64)])
    model = ci.host_cache_model(root)
    assert model == ("--I1=65536,16,64", "--D1=49152,12,64", "--LL=2097152,16,64")  # L2: LL
    assert ci.describe_cache_model(model) == "L1 data 48 KB 12-way, last level 2 MB 16-way"
    monkeypatch.setattr(ci, "CACHE_DIR", root)
    monkeypatch.setattr(ci, "host_cache_model", lambda: model)
    ns = SimpleNamespace(what="rollout", cluster="hetero-1", trace="bfcl_v3", num_workflows=400,
                         load=1.0, policy="hexagent", steps=1, seed=0, misses=True)
    assert ci.child_command(SimpleNamespace(**vars(ns), cache_model="host"), 0)[2:6] == [
        "--cache-sim=yes", *model]
    assert ci.child_command(ns, 0)[3:6] == list(ci.CACHE_MODEL)  # default: the fixed model


def test_host_cache_model_says_what_it_cannot_read(tmp_path, capsys):
    no_l2 = _sysfs(tmp_path / "a", [(1, "Data", "32K", 8, 64), (1, "Instruction", "32K", 8, 64)])
    with pytest.raises(ValueError, match=r"does not describe this machine's level 2 Unified "
                                         r"cache\(s\); use --cache-model fixed"):
        ci.host_cache_model(no_l2)
    garbled = _sysfs(tmp_path / "b", [(1, "Data", "lots", 8, 64)])
    with pytest.raises(ValueError, match=r"index0: unreadable size, ways or line size "
                                         r"\('lots', '8', '64'\)"):
        ci.host_cache_model(garbled)
    with pytest.raises(ValueError, match="level 1 Data"):
        ci.host_cache_model(tmp_path / "absent")
