"""The command-line layer: one module per command, each with ``main(argv) -> int``.

A package so that the ``hexagent-gym`` console command (:mod:`scripts.cli`) can import the
scripts; each one still runs as ``python scripts/<name>.py`` from a checkout, because the scripts
import only installed packages (``hexagent_gym``, ``envs``, ``agents``), never each other.
"""
