"""The command-line layer: one module per command, each with ``main(argv) -> int``.

A package so that the ``hexagent-gym`` console command (:mod:`hexagent_gym.scripts.cli`) can import
the scripts; each one still runs as ``python scripts/<name>.py`` from a checkout, because the
scripts import only the installed package (``hexagent_gym``, with ``hexagent_gym.envs`` and
``hexagent_gym.agents``), never each other.
"""
