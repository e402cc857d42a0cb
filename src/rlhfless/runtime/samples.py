"""The data that crosses the step's phases: tokenized prompts in, scored samples out."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from rlhfless.data import Prompt
from rlhfless.engine.sequences import SequenceResult


@dataclass
class StepPrompt:
    """A prompt of this step, rendered with the chat template and tokenized once."""

    prompt: Prompt
    text: str
    prompt_ids: list[int]

    @property
    def uid(self) -> str:
        return self.prompt.uid


@dataclass
class Sample:
    """One response to one prompt. The learner consumes samples in canonical (uid, sample) order."""

    uid: str
    sample: int
    prompt_ids: list[int]
    response_ids: list[int]
    finish_reason: str
    response: str = ""
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, int]:
        return (self.uid, self.sample)


def decoded(results: list[SequenceResult], tokenizer) -> list[Sample]:
    """The engine's finished sequences as samples, their responses decoded in one batch."""
    texts = tokenizer.batch_decode([r.response_ids for r in results], skip_special_tokens=True)
    return [
        Sample(r.uid, r.sample, list(r.prompt_ids), list(r.response_ids), r.finish_reason, text)
        for r, text in zip(results, texts, strict=True)
    ]


def canonical(samples: list[Sample]) -> list[Sample]:
    """Samples sorted by (uid, sample): the order is independent of which actor produced what."""
    return sorted(samples, key=lambda s: s.key)


def response_lengths(samples: list[Sample]) -> dict[str, list[int]]:
    """Each prompt's response lengths, in the samples' order."""
    lengths: dict[str, list[int]] = {}
    for s in samples:
        lengths.setdefault(s.uid, []).append(len(s.response_ids))
    return lengths


def rollout_metrics(samples: list[Sample]) -> dict[str, float]:
    """Reward and length curves of scored samples (a step's; a validation's, under `val/`)."""
    rewards = [s.reward for s in samples]
    lengths = [len(s.response_ids) for s in samples]
    out = {
        "reward/mean": statistics.fmean(rewards),
        "reward/std": statistics.pstdev(rewards),
        "response_length/mean": statistics.fmean(lengths),
        "response_length/max": float(max(lengths)),
        "response_length/clip_ratio": sum(s.finish_reason == "length" for s in samples) / len(samples),
    }
    for key in sorted({k for s in samples for k in s.reward_components}):
        out[f"reward/{key}"] = statistics.fmean(s.reward_components.get(key, 0.0) for s in samples)
    return out
