"""Serving features around the event loop: prefix caches per prefill instance and sample groups.

A *sample group* is the ``n`` samples of one request (LATS asks ``gpt(prompt, n=5)``): one prompt,
one prefill and one KV transfer, then ``n`` sequences decoding on one instance that share the
prompt's KV. The group's first call is its *leader*: it alone waits in the prefill queue and is
planned; the others *ride* it. The leader carries the group's KV demand
(``L_in + Σ L_out``) and predicted demand, and its predicted output is the group's longest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from hexagent_gym.sim.prefix_cache import PrefixCache
from hexagent_gym.workload.prompts import DEFAULT_BLOCK_TOKENS
from hexagent_gym.workload.specs import TraceError

if TYPE_CHECKING:
    from hexagent_gym.cluster.cluster import ClusterSpec
    from hexagent_gym.planning.entities import Call, Workflow
    from hexagent_gym.workload.specs import WorkflowSpec


def workload_block_tokens(workflows: Iterable[WorkflowSpec]) -> int:
    """The block size shared by every workflow of an episode (the caches' block size)."""
    sizes = {w.block_tokens for w in workflows}
    if len(sizes) > 1:
        raise TraceError(f"the episode mixes prompt block sizes {sorted(sizes)}; one prefix cache "
                         "needs one block size: load every workflow with the same block_tokens")
    return sizes.pop() if sizes else DEFAULT_BLOCK_TOKENS


def build_caches(cluster: ClusterSpec, capacity_tokens: float | None,
                 block_tokens: int) -> list[PrefixCache]:
    """One prefix cache per prefill instance, sharing one block index (``PrefixCache.holders``).

    ``capacity_tokens``: None sizes each cache from its instance's KV memory; ``math.inf`` makes
    them unbounded; otherwise a number of tokens (>= 0) for every instance.
    """
    if capacity_tokens is not None and not math.isinf(capacity_tokens) and (
            isinstance(capacity_tokens, bool) or capacity_tokens < 0):
        raise ValueError(f"prefix_cache_tokens must be >= 0, None (sized from memory) or "
                         f"math.inf (unbounded), got {capacity_tokens!r}")
    caches = []
    holders: dict[int, int] = {}  # block id -> bit mask of the instances caching it
    for i, inst in enumerate(cluster.prefill):
        if capacity_tokens is None:
            cap: int | None = inst.kv_capacity_tokens
        elif math.isinf(capacity_tokens):
            cap = None
        else:
            cap = int(capacity_tokens)
        caches.append(PrefixCache(cap, block_tokens, holders, i))
    return caches


def form_group(wf: Workflow, leader: int) -> None:
    """Make the leader's call carry its sample group: riders link to it, demands add up."""
    lead = wf.calls[leader]
    riders = lead.spec.riders
    lead.width = 1 + len(riders)
    kv_true = lead.l_in + lead.l_out
    kv_pred = lead.l_in + lead.l_out_pred
    longest = lead.l_out_pred
    for r in riders:
        c = wf.calls[r]
        c.lead = lead
        kv_true += c.l_out
        kv_pred += c.l_out_pred
        if c.l_out_pred > longest:
            longest = c.l_out_pred
        c.kv_true = c.kv_pred = c.kv_res = 0  # reserved through the leader
        c.kv_free = c.l_out
    # a group reserves its true demand at admission (a max_tokens-style bound: the samples of
    # one request are capped together), so it never outgrows its reservation
    lead.kv_true, lead.kv_pred, lead.kv_res, lead.kv_free = kv_true, kv_pred, kv_true, lead.l_out
    lead.l_out_pred = longest
    lead.ctx_share = lead.l_in + 0.5 * longest  # as Call.__init__ writes it


def call_riders(lead: Call) -> list[Call]:
    """The calls riding a group leader."""
    calls = lead.workflow.calls
    return [calls[r] for r in lead.spec.riders]


def check_group_width(workflows: Iterable[WorkflowSpec], cluster: ClusterSpec,
                      enabled: bool) -> None:
    """Fail early when a sample group has more samples than any decode instance batches."""
    if not enabled:
        return
    widest = max(inst.max_batch_size for inst in cluster.decode)
    for wf in workflows:
        for c in wf.calls:
            if c.riders and 1 + len(c.riders) > widest:
                raise TraceError(
                    f"workflow '{wf.workflow_id}' (line {wf.line}): sample group of call "
                    f"'{c.id}' has {1 + len(c.riders)} samples but every decode instance of "
                    f"cluster '{cluster.name}' batches at most {widest}; raise max_batch_size or "
                    "turn parallel_sampling off")
