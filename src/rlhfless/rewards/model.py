"""A learned reward: a local sequence-classification checkpoint scores (prompt, response) pairs.

The pair is rendered with the reward model's own chat template (prompt messages, then the response
as the assistant's turn), so its tokenizer need not be the policy's. Pairs are scored in batches,
right-padded; the score is the head's first logit at each pair's last real token.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rlhfless.data.prompts import Prompt
from rlhfless.inputs import first_line


class RewardModelError(ValueError):
    """A reward model that cannot be loaded from `reward.model`."""


class RewardModel:
    """Loaded once per process; `__call__` scores many pairs, `batch_size` at a time."""

    def __init__(self, path: str, batch_size: int = 16, max_tokens: int = 2048) -> None:
        where = Path(path).expanduser()
        if not (where / "config.json").is_file():
            raise RewardModelError(f"reward.model: {path!r} is not a checkpoint directory with a config.json")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(where, local_files_only=True)
            self.model = AutoModelForSequenceClassification.from_pretrained(where, local_files_only=True)
        except (OSError, ValueError) as err:
            raise RewardModelError(f"reward.model: {path}: cannot load ({first_line(err)})") from None
        self.model.eval().requires_grad_(False)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "right"
        self.tokenizer.truncation_side = "left"  # a long pair keeps the end of the response
        self.batch_size, self.max_tokens = batch_size, max_tokens

    def render(self, prompt: Prompt, response: str) -> str:
        """The text the reward model reads: its chat template if it has one, else plain turns."""
        messages = [*prompt.messages, {"role": "assistant", "content": response}]
        if self.tokenizer.chat_template:
            return self.tokenizer.apply_chat_template(messages, tokenize=False)
        return "\n".join(m["content"] for m in messages)

    @torch.no_grad()
    def __call__(self, prompts: list[Prompt], responses: list[str]) -> list[float]:
        texts = [self.render(p, r) for p, r in zip(prompts, responses, strict=True)]
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(
                texts[start : start + self.batch_size],
                padding=True,
                truncation=True,
                max_length=self.max_tokens,
                add_special_tokens=False,
                return_tensors="pt",
            )
            scores.extend(self._score(enc["input_ids"], enc["attention_mask"]).tolist())
        return scores

    def _score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        head = getattr(self.model, "score", None)  # decoder classifiers: pool the last real token here
        if isinstance(head, torch.nn.Module):
            hidden = self.model.base_model(input_ids=input_ids, attention_mask=attention_mask)
            last = attention_mask.sum(-1) - 1
            logits = head(hidden.last_hidden_state[torch.arange(len(last)), last])
        else:  # encoders and others pool in their own forward
            logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        return logits[:, 0].float()
