"""The agents package's plug-in: registers the built-in policies and the saved-model loader with
the core's registries (``pyproject.toml`` declares it in the ``hexagent_gym.plugins`` group).

Policies are named by ``"module:attr"`` strings and imported on first use, so listing the names
loads no torch.
"""

from __future__ import annotations

from hexagent_gym.policy import register_model_loader, register_policy

A = "hexagent_gym.agents."  # the installed name of this package

BUILTIN_POLICIES = {
    "hexagent": A + "hexagent:HexAgentPolicy",
    "hexagent-lookahead": A + "lookahead:HexAgentLookahead",  # one-step lookahead teacher
    "hexagent-search": A + "search:HexAgentSearch",  # rollout search, scheduler's knowledge
    "hexagent-search-oracle": A + "search:HexAgentSearchOracle",  # ... true future: a bound
    "hexagent-search-revealed": A + "search:HexAgentSearchRevealed",  # ... revealed calls only
    "hexagent-horizon": A + "hexagent:HexAgentHorizon",  # risk over max(H_w(t), forecast Ĥ_w)
    "hexagent-nocache": A + "hexagent:HexAgentNoCache",  # plans with no-cache prefill times
    "hexagent-lb": A + "ablation:HexAgentLoadBalanced",  # risk order, load-balanced placement
    "fcfs": A + "baselines:CallFCFS",
    "wf-fcfs": A + "baselines:WorkflowFCFS",
    "llf": A + "baselines:LeastLaxityFirst",
    "atlas": A + "baselines:Atlas",
    "sglang-router": A + "cache_aware:SGLangRouter",  # sgl-router cache_aware load balancer
    "random": A + "baselines:RandomPolicy",
    "fallback": A + "baselines:FallbackPolicy",
    "learned": A + "learned:LearnedPolicy",  # the shipped model (models/), docs/learned.md
}


def register() -> None:
    """Register every built-in policy and the ``.zip`` (sb3-contrib MaskablePPO) loader."""
    for name, entry in BUILTIN_POLICIES.items():
        register_policy(name, entry)
    register_model_loader(".zip", A + "saved_models:load_saved_model")
