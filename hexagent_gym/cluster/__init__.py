"""The hardware and its speeds: GPU and model YAML, cluster specs and their transfer
tables, random clusters, and the roofline latency model (prefill and decode step times)
with its calibration. Imports only ``hexagent_gym.config`` (no workload, no state).
"""
