"""Gymnasium environments over the hexagent_gym simulator core."""
