"""YAML configuration data shipped with hexagent-gym (GPUs, models, clusters, experiments).

This is a package only so that the YAML files install next to the code; it holds no logic.
"""
