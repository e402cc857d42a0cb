"""One training step's generation on an engine, with or without deduplicated prefill."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlhfless.engine.prefixes import PrefixTree
from rlhfless.engine.sampling import SamplingParams
from rlhfless.engine.sequences import Request, SequenceResult

if TYPE_CHECKING:
    from rlhfless.engine.base import GenerationEngine


@dataclass
class RolloutStats:
    """What one rollout cost; the `prefill/*` and `time/*` step metrics come from here."""

    prompt_tokens_computed: int
    prompt_tokens_naive: int
    prefill_seconds: float
    decode_seconds: float
    decode_steps: int
    tokens_generated: int
    unique_prefixes: int  # prefix tree nodes computed
    prefix_bytes: int

    def metrics(self) -> dict[str, float]:
        return {
            "prefill/tokens_computed": self.prompt_tokens_computed,
            "prefill/tokens_naive": self.prompt_tokens_naive,
            "time/prefill": self.prefill_seconds,
            "time/decode": self.decode_seconds,
        }


def rollout(
    engine: GenerationEngine,
    prompts: list[tuple[str, list[int]]],
    group_size: int,
    params: SamplingParams,
    step: int,
    tree: PrefixTree | None,
) -> tuple[list[SequenceResult], RolloutStats]:
    """Sample `group_size` responses for each (uid, prompt_ids).

    With a prefix `tree` (the planner's levels), each level is prefilled once from its parent's
    KV, each prompt starts from its node's KV and prefills the rest of it once, shared by its G
    samples. `None` turns dedup off: every sample prefills its full prompt (the naive baseline).
    Results come in prompt order, then sample order.
    """
    before = engine.snapshot_stats()
    nodes, prefix_bytes = 0, 0
    if tree is None:
        requests = [
            Request(uid, ids, 1, sample_indices=[g]) for uid, ids in prompts for g in range(group_size)
        ]
    else:
        kvs = engine.prefill(tree.tokens, tree.parents)
        nodes, prefix_bytes = len(kvs), sum(kv.nbytes for kv in kvs)
        requests = [
            Request(uid, ids, group_size, prefix=kvs[tree.node_of[uid]] if uid in tree.node_of else None)
            for uid, ids in prompts
        ]
    results = engine.generate(requests, params, step)
    spent = engine.snapshot_stats().minus(before)
    stats = RolloutStats(
        prompt_tokens_computed=spent.prompt_tokens_computed,
        prompt_tokens_naive=spent.prompt_tokens_naive,
        prefill_seconds=spent.prefill_seconds,
        decode_seconds=spent.decode_seconds,
        decode_steps=spent.decode_steps,
        tokens_generated=spent.tokens_generated,
        unique_prefixes=nodes,
        prefix_bytes=prefix_bytes,
    )
    return results, stats
