"""The agents package's plug-in: registers the built-in policies and the saved-model loader with
the core's registries (``pyproject.toml`` declares it in the ``hexagent_gym.plugins`` group).

Policies are named by ``"module:attr"`` strings and imported on first use, so listing the names
loads no torch.
"""

from __future__ import annotations

from hexagent_gym.policy import register_model_loader, register_policy

BUILTIN_POLICIES = {
    "hexagent": "agents.hexagent:HexAgentPolicy",
    "hexagent-lookahead": "agents.lookahead:HexAgentLookahead",  # one-step lookahead teacher
    "hexagent-search": "agents.search:HexAgentSearch",  # rollout search, scheduler's knowledge
    "hexagent-search-oracle": "agents.search:HexAgentSearchOracle",  # ... true future: a bound
    "hexagent-search-revealed": "agents.search:HexAgentSearchRevealed",  # ... revealed calls only
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
}


def register() -> None:
    """Register every built-in policy and the ``.zip`` (sb3-contrib MaskablePPO) loader."""
    for name, entry in BUILTIN_POLICIES.items():
        register_policy(name, entry)
    register_model_loader(".zip", "agents.saved_models:load_saved_model")
