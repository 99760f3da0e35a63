"""The policy interface over decision points, and the registry of policies by name.

A policy answers a :class:`~hexagent_gym.decisions.DecisionPoint` one pick at a time. Built-in
policies live in the ``agents`` package; they are registered here by entry-point strings (as
Gymnasium registers environments) so the core and the env can resolve names without importing
the agents layer at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from hexagent_gym.registry import Registry

if TYPE_CHECKING:
    from hexagent_gym.decisions import DecisionPoint
    from hexagent_gym.metrics import EpisodeResult
    from hexagent_gym.simulator import Simulator


@runtime_checkable
class Policy(Protocol):
    """What the simulator and the env need from a scheduler."""

    name: str

    def reset(self, sim: Simulator) -> None:
        """Called once before an episode starts (drop per-episode state)."""

    def pick(self, dp: DecisionPoint) -> tuple[int, int, int]:
        """Return (call slot, prefill instance, decode instance) for the next-ranked call."""


_POLICIES = Registry("policy")


def register_policy(name: str, entry_point: str | Callable[..., Policy]) -> None:
    """Register a policy factory under ``name`` (``"module:attr"`` or a callable).

    Raises:
        ValueError: the name is taken (re-registering silently would hide typos and clashes).
    """
    _POLICIES.register(name, entry_point)


def policy_names() -> list[str]:
    """Registered policy names, sorted."""
    return _POLICIES.names()


def make_policy(name: str, **kwargs: Any) -> Policy:
    """Instantiate a registered policy by name (case-insensitive).

    Raises:
        ValueError: unknown name; the message lists the known ones and the closest match.
    """
    return _POLICIES.factory(name)(**kwargs)


def run_policy(sim: Simulator, policy: Policy) -> EpisodeResult:
    """Run one whole episode on the bare simulator with ``policy`` answering every decision."""
    policy.reset(sim)
    return sim.run(policy.pick, policy_name=policy.name)


# Built-in policies (agents package), resolved lazily on first use.
for _name, _entry in {
    "hexagent": "agents.hexagent:HexAgentPolicy",
    "hexagent-lookahead": "agents.lookahead:HexAgentLookahead",  # one-step lookahead teacher
    "hexagent-nocache": "agents.hexagent:HexAgentNoCache",  # plans with no-cache prefill times
    "hexagent-lb": "agents.ablation:HexAgentLoadBalanced",  # risk order, load-balanced placement
    "fcfs": "agents.baselines:CallFCFS",
    "wf-fcfs": "agents.baselines:WorkflowFCFS",
    "llf": "agents.baselines:LeastLaxityFirst",
    "atlas": "agents.baselines:Atlas",
    "sglang-router": "agents.cache_aware:SGLangRouter",  # sgl-router cache_aware load balancer
    "random": "agents.baselines:RandomPolicy",
    "fallback": "agents.baselines:FallbackPolicy",
    "learned": "agents.learned:LearnedPolicy",  # the shipped model (models/), docs/learned.md
}.items():
    register_policy(_name, _entry)
