"""What arrives: workflow and call specs, trace files and their parsing (JSONL, Mooncake,
Qwen-Bailian, streamed lazily), prompt block ids, synthetic sessions and the sampling of
an episode's workflows and arrival times. Imports only ``hexagent_gym.config``; knows
nothing of clusters, schedulers or the engine.
"""
