"""The ``hexagent-gym`` console command: each subcommand runs its script's ``main`` with the rest
of the command line, bad commands exit 2 naming the valid ones, and the installed entry point
works end to end."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import hexagent_gym.scripts.bench
import hexagent_gym.scripts.evaluate
import hexagent_gym.scripts.train
from hexagent_gym.scripts import cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command, module", [("evaluate", hexagent_gym.scripts.evaluate),
                                             ("train", hexagent_gym.scripts.train),
                                             ("bench", hexagent_gym.scripts.bench)])
def test_each_command_calls_its_scripts_main_with_the_rest_of_argv(command, module, monkeypatch):
    calls = []

    def fake_main(argv):
        calls.append((list(argv), sys.argv[0]))
        return 7

    monkeypatch.setattr(module, "main", fake_main)
    argv0 = sys.argv[0]
    assert cli.main([command, "--seed", "3", "x"]) == 7  # main's status is the command's
    assert calls == [(["--seed", "3", "x"], f"hexagent-gym {command}")]
    assert sys.argv[0] == argv0  # argparse's program name is restored afterwards


def test_every_command_names_a_script_with_main():
    for command in cli.COMMANDS:
        assert (ROOT / "scripts" / f"{command}.py").is_file()
        assert callable(importlib.import_module(f"hexagent_gym.scripts.{command}").main)


def test_unknown_command_exits_2_naming_the_valid_ones(capsys):
    assert cli.main(["evalute", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'evalute'" in err and "did you mean 'evaluate'" in err
    assert "evaluate, train, bench" in err


def test_help_lists_the_commands_and_no_command_is_an_error(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(command in out for command in cli.COMMANDS)
    assert cli.main([]) == 2
    assert "a command is required" in capsys.readouterr().err


def _console_script() -> str:
    exe = shutil.which("hexagent-gym", path=sysconfig.get_path("scripts"))
    if exe is None:
        pytest.fail("the hexagent-gym console script is not installed next to this Python; "
                    "run `pip install -e .`")
    return exe


def test_installed_console_script_runs_help_and_a_tiny_evaluation(tmp_path):
    exe = _console_script()
    proc = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "evaluate" in proc.stdout and "bench" in proc.stdout
    proc = subprocess.run([exe, "nope"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "valid commands" in proc.stderr
    # a real subcommand, run outside the checkout: the entry point needs no cwd on sys.path
    out = tmp_path / "eval"
    proc = subprocess.run([exe, "evaluate", "--policies", "fcfs,hexagent", "--clusters",
                           "tiny-2p2d", "--traces", "bfcl_v3", "--seeds", "0",
                           "--num-workflows", "6", "--load", "1.0", "--out", str(out),
                           "--quiet"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cells = json.loads((out / "results.json").read_text())["cells"]
    assert sorted(c["cell"]["policy"] for c in cells) == ["fcfs", "hexagent"]
    assert all(0 < c["metrics"]["req99"] < float("inf") for c in cells)
    assert "| tiny-2p2d | bfcl_v3 |" in proc.stdout  # the printed table
    proc = subprocess.run([exe, "evaluate", "--bogus"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and "usage: hexagent-gym evaluate" in proc.stderr
