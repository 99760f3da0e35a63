"""Prompt identity: which prompt blocks of a call equal blocks of other prompts.

A prompt is cut into blocks of ``block_tokens`` tokens (Mooncake's convention; the last block may
be partial) and each block gets an integer id. Two blocks at the same position with the same id
hold the same tokens *and* are preceded by the same tokens, so a prefix cache can match a prompt
by walking its ids in order (ids are chained like Mooncake's hash ids; a flat id → block map then
behaves as a radix tree).

Our own traces carry no ids; :func:`derive_blocks` builds them from what they do carry:

- ``prefix_of`` + ``prefix_tokens``: the first ``prefix_tokens`` tokens of the prompt equal the
  first tokens of that earlier call's *input + output*;
- a shared static prefix: BFCL workflows with equal ``meta.system_prefix_key`` share their first
  ``meta.system_prefix_tokens`` tokens; a LATS call's ``template`` gives a static prefix shared
  by every workflow (:data:`TEMPLATE_PREFIX_TOKENS`); any call may also name one itself with
  ``shared_prefix_key`` + ``shared_prefix_tokens``;
- ``hash_ids`` on a call: the ids as given (Mooncake / Bailian convention), remapped into the
  trace's id space.

Only *full* blocks are inherited: a block is shared when it ends inside the shared prefix. A
prompt's trailing partial block gets an id of its own, since a prefill instance holds the prompt
only (the output's KV lives on the decode side), so it can match nothing but an identical prompt.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence

DEFAULT_BLOCK_TOKENS = 512
"""Tokens per prompt block for traces that carry no ids of their own (Mooncake's block size)."""

TEMPLATE_PREFIX_TOKENS = {
    "cot": 1548, "cot_s": 1063, "cot_fb": 1633, "cot_fb_s": 1125,
    "val": 1932, "val_fb": 1916, "val_fb_s": 990, "refl": 2772,
}
"""Static prefix (Llama-3 tokens incl. BOS and header) of each LATS prompt template, shared by
every LATS workflow (from the LATS HotpotQA prompts; see docs/traces.md)."""

# Process-wide source of fresh ids: ids only ever compare for equality, so their values (which
# depend on load order) never reach a result; uniqueness across traces is what matters.
_FRESH = itertools.count(1)


class BlockIds:
    """Allocates block ids for one trace: fresh ids and ids shared by key within the trace."""

    __slots__ = ("_shared", "_external")

    def __init__(self) -> None:
        self._shared: dict[Hashable, int] = {}
        self._external: dict[int, int] = {}

    @staticmethod
    def fresh() -> int:
        """An id equal to no other block."""
        return next(_FRESH)

    def shared(self, key: Hashable) -> int:
        """The id of a block every prompt of this trace with the same ``key`` shares."""
        got = self._shared.get(key)
        if got is None:
            got = self._shared[key] = next(_FRESH)
        return got

    def external(self, value: int) -> int:
        """The id of a trace-given hash id (equal values map to equal ids within the trace)."""
        got = self._external.get(value)
        if got is None:
            got = self._external[value] = next(_FRESH)
        return got


def num_blocks(tokens: int, block_tokens: int) -> int:
    """Blocks (the last one possibly partial) covering ``tokens`` tokens."""
    return -(-tokens // block_tokens)


def derive_blocks(ids: BlockIds, block_tokens: int, inputs: Sequence[int],
                  outputs: Sequence[int], prefix_of: Sequence[int],
                  prefix_tokens: Sequence[int], shared: Sequence[tuple[Hashable, int] | None],
                  given: Sequence[Sequence[int] | None]) -> list[tuple[int, ...]]:
    """Prompt block ids of every call of one workflow, in call order.

    Args:
        ids: the trace's id allocator.
        block_tokens: tokens per block.
        inputs, outputs: each call's prompt and output lengths.
        prefix_of: index of the earlier call whose input + output this prompt extends (−1: none).
        prefix_tokens: how many leading tokens that reuse covers (0 with no ``prefix_of``).
        shared: ``(key, tokens)`` of a static prefix shared across workflows, or None.
        given: trace-given hash ids of the prompt (already validated for length), or None.

    Returns:
        One tuple of ``ceil(input / block_tokens)`` ids per call.
    """
    full_ids: list[list[int]] = []  # ids of the full blocks of each call's input + output
    prompts: list[tuple[int, ...]] = []
    for i, (n_in, n_out) in enumerate(zip(inputs, outputs, strict=True)):
        parent = prefix_of[i]
        reuse = prefix_tokens[i] if parent >= 0 else 0
        key, static = shared[i] if shared[i] is not None else (None, 0)
        external = given[i]
        seq: list[int] = []
        for b in range((n_in + n_out) // block_tokens):
            end = (b + 1) * block_tokens
            if external is not None and b < len(external) and end <= n_in:
                seq.append(ids.external(external[b]))
            elif end <= reuse and b < len(full_ids[parent]):
                seq.append(full_ids[parent][b])
            elif end <= static:
                seq.append(ids.shared((key, b)))
            else:
                seq.append(ids.fresh())
        full_ids.append(seq)
        whole, rest = divmod(n_in, block_tokens)
        prompt = seq[:whole]
        if rest:
            if external is not None and len(external) > whole:
                prompt.append(ids.external(external[whole]))
            else:
                prompt.append(ids.fresh())
        prompts.append(tuple(prompt))
    return prompts


def own_hit_tokens(prompts: Sequence[tuple[int, ...]], inputs: Sequence[int],
                   block_tokens: int) -> list[int]:
    """Per call, the prompt tokens that earlier calls of the same workflow already hold.

    This is the hit a call can expect when its workflow runs alone on a cold cache (the
    scheduler's standalone estimate): its leading blocks found among the prompts of the calls
    listed before it.
    """
    seen: set[int] = set()
    hits = []
    for blocks, n_in in zip(prompts, inputs, strict=True):
        k = 0
        for b in blocks:
            if b not in seen:
                break
            k += 1
        hits.append(min(k * block_tokens, n_in))
        seen.update(blocks)
    return hits
