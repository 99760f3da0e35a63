"""Scheduling policies: HexAgent reference, classical baselines and learned schedulers.

Policies are resolved by name through ``hexagent_gym.policy.make_policy`` (``hexagent``,
``fcfs``, ``wf-fcfs``, ``llf``, ``atlas``, ``random``, ``fallback``).
"""

from hexagent_gym.policy import make_policy, policy_names, register_policy, run_policy

__all__ = ["make_policy", "policy_names", "register_policy", "run_policy"]
