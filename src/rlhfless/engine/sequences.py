"""What goes into and comes out of a generation engine: requests, partial states, results, counters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlhfless.engine.kv import PrefixKV

FinishReason = Literal["stop", "length"]


@dataclass
class Request:
    """A prompt to sample `num_samples` responses for, maybe starting from a shared prefix KV.

    `sample_indices` names the samples (defaults to 0..num_samples-1); the index is part of each
    sample's random key, so sample 2 of a prompt is the same sequence wherever it is generated.
    """

    uid: str
    prompt_ids: list[int]
    num_samples: int = 1
    prefix: PrefixKV | None = None
    sample_indices: list[int] | None = None

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError(f"prompt_ids: got an empty prompt for uid {self.uid!r}, expected >= 1 token")
        if self.sample_indices is None:
            self.sample_indices = list(range(self.num_samples))
        if len(self.sample_indices) != self.num_samples:
            raise ValueError(
                f"sample_indices: got {len(self.sample_indices)} indices, expected num_samples={self.num_samples}"
            )
        if self.prefix is not None and self.prefix.token_ids != self.prompt_ids[: len(self.prefix)]:
            raise ValueError(f"prefix: its tokens are not a prefix of uid {self.uid!r}'s prompt")


@dataclass
class SequenceState:
    """An unfinished sequence, as `cut()` hands it over for `resume()` on any engine.

    `kv`, when present, covers prompt_ids + generated_ids[:-1] (the last token is not yet fed), so
    resuming computes one token instead of re-prefilling everything.
    """

    uid: str
    sample: int
    prompt_ids: list[int]
    generated_ids: list[int]
    logprobs: list[float]
    kv: PrefixKV | None = None


@dataclass
class SequenceResult:
    uid: str
    sample: int
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason


@dataclass
class Progress:
    """Counts since the engine was created; a controller cuts an actor when finished/total >= tau."""

    finished: int
    total: int
    running: int
    queued: int
    free_slots: int


@dataclass
class EngineStats:
    """Work counters. `prompt_tokens_naive` is what prefilling every sample's full prompt would
    cost; `resume_tokens_computed` what resuming cut sequences re-prefilled (not prompt work)."""

    prompt_tokens_computed: int = 0
    prompt_tokens_naive: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    decode_steps: int = 0
    tokens_generated: int = 0
    resume_tokens_computed: int = 0

    def minus(self, before: EngineStats) -> EngineStats:
        """The work done since `before` (a copy taken earlier)."""
        return EngineStats(
            self.prompt_tokens_computed - before.prompt_tokens_computed,
            self.prompt_tokens_naive - before.prompt_tokens_naive,
            self.prefill_seconds - before.prefill_seconds,
            self.decode_seconds - before.decode_seconds,
            self.decode_steps - before.decode_steps,
            self.tokens_generated - before.tokens_generated,
            self.resume_tokens_computed - before.resume_tokens_computed,
        )
