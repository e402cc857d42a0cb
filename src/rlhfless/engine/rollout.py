"""One training step's generation on an engine, with or without deduplicated prefill."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

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
    unique_prefixes: int
    prefix_length: int | None
    prefix_bytes: int

    def metrics(self) -> dict[str, float]:
        return {
            "prefill/tokens_computed": self.prompt_tokens_computed,
            "prefill/tokens_naive": self.prompt_tokens_naive,
            "time/prefill": self.prefill_seconds,
            "time/decode": self.decode_seconds,
        }


def shared_prefix(prompt_ids: list[int], prefix_length: int) -> tuple[int, ...]:
    """The part of a prompt whose KV is shared: its first `prefix_length` tokens, leaving at least
    one prompt token to compute per prompt (its logits give the first response token)."""
    return tuple(prompt_ids[: min(prefix_length, len(prompt_ids) - 1)])


def rollout(
    engine: GenerationEngine,
    prompts: list[tuple[str, list[int]]],
    group_size: int,
    params: SamplingParams,
    step: int,
    prefix_length: int | None,
) -> tuple[list[SequenceResult], RolloutStats]:
    """Sample `group_size` responses for each (uid, prompt_ids).

    With `prefix_length` (chosen by the planner), prompts are grouped by their first
    `prefix_length` tokens, each unique prefix is prefilled once, and each prompt's G samples share
    its full-prompt KV. `None` turns dedup off: every sample prefills its full prompt (the naive
    baseline). Results come in prompt order, then sample order.
    """
    before = engine.snapshot_stats()
    unique, prefix_bytes = 0, 0
    if prefix_length is None:
        requests = [
            Request(uid, ids, 1, sample_indices=[g]) for uid, ids in prompts for g in range(group_size)
        ]
    else:
        keys = [shared_prefix(ids, prefix_length) for _, ids in prompts]
        distinct = list(dict.fromkeys(k for k in keys if k))
        kvs = dict(zip(distinct, engine.prefill([list(k) for k in distinct]), strict=True))
        unique, prefix_bytes = len(distinct), sum(kv.nbytes for kv in kvs.values())
        requests = [
            Request(uid, ids, group_size, prefix=kvs.get(key))
            for (uid, ids), key in zip(prompts, keys, strict=True)
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
        unique_prefixes=unique,
        prefix_length=prefix_length,
        prefix_bytes=prefix_bytes,
    )
    return results, stats
