"""The unit of training data: one prompt, its reference answer and how to score it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from rlhfless.inputs import InputError


class DataError(InputError):
    """A data file or row that cannot become a prompt; the message names file, row and field."""


@dataclass
class Prompt:
    """One training prompt, identical in every epoch and picklable for Ray workers.

    `uid` keys everything per prompt across steps (GRPO groups, the length predictor's history,
    rollout files), so it depends only on where the prompt came from and what it says.
    """

    uid: str
    messages: list[dict[str, str]]
    ground_truth: str | None
    data_source: str
    extra_info: dict[str, Any] = field(default_factory=dict)
    # Where the prompt was read ("train.jsonl: row 3"), for errors that name it; not part of identity.
    origin: str = field(default="", compare=False)
    # The data gave the prompt as chat messages (TRL's conversational format), not one string: a
    # TRL reward function then receives its completions as messages too. Not part of identity.
    chat: bool = field(default=False, compare=False)

    @property
    def question(self) -> str:
        """The last user message: what the prompt asks, without the shared system prefix."""
        for message in reversed(self.messages):
            if message["role"] == "user":
                return message["content"]
        return ""


def make_uid(data_source: str, index: int, messages: list[dict[str, str]]) -> str:
    """A short stable id from origin and content (sha1 of canonical JSON; not Python's salted hash)."""
    payload = json.dumps([data_source, index, messages], sort_keys=True, ensure_ascii=False)
    return hashlib.sha1(payload.encode("utf-8")).hexdigest()[:16]


def with_system_prompt(messages: list[dict[str, str]], system_prompt: str) -> list[dict[str, str]]:
    """Prepend the configured system prompt unless the conversation already has one."""
    if not system_prompt or any(m["role"] == "system" for m in messages):
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]


def check_prompt_tokens(
    prompts: list[Prompt], tokenizer: Any, max_tokens: int, positions: int | None = None, new_tokens: int = 0
) -> None:
    """Refuse, before a run writes anything, a prompt longer than `generation.max_prompt_tokens`,
    or one that with `new_tokens` (`generation.max_new_tokens`) would run past the model's
    `positions` (its `max_position_embeddings`, None: no limit known), where a model with a
    position table (GPT-2) fails and a rotary one runs beyond what it was trained on.

    Counts tokens as the step does: the chat template with the generation prompt, no extra specials.
    """
    for p in prompts:
        text = tokenizer.apply_chat_template(p.messages, tokenize=False, add_generation_prompt=True)
        n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        where = p.origin or f"prompt {p.uid} ({p.data_source})"
        if n > max_tokens:
            raise DataError(
                f"{where}: field 'prompt': {n} tokens with the chat template, expected at most "
                f"generation.max_prompt_tokens={max_tokens}"
            )
        if positions is not None and n + new_tokens > positions:
            raise DataError(
                f"{where}: field 'prompt': {n} tokens with the chat template and "
                f"generation.max_new_tokens={new_tokens} need {n + new_tokens} positions, expected at "
                f"most the model's max_position_embeddings={positions}"
            )
