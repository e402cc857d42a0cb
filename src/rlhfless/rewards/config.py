"""The `reward.` config section: how responses are scored."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rlhfless.rewards.answers import ANSWER_FORMATS


@dataclass
class RewardConfig:
    """Rule-based correctness plus a small format bonus, or a user function; validated on construction."""

    answer_format: str = field(
        default="answer_tag",
        metadata={
            "help": "where the final answer is read from: 'answer_tag' = between <answer> and </answer> "
            "(last pair; an unclosed final <answer> gives the rest of its line), 'boxed' = last \\boxed{...}"
        },
    )
    format_weight: float = field(
        default=0.2,
        metadata={
            "help": "weight of the format reward added to correctness: 1 for a complete answer in the "
            "format, 0.5 for an opened but unfinished one, 0 for none; 0 disables"
        },
    )
    flexible_credit: float = field(
        default=0.5,
        metadata={
            "help": "when a response has no answer in answer_format, its last number is scored instead "
            "(VERL gsm8k's 'flexible' extraction) and earns this share of the correctness score; 0 = strict"
        },
    )
    correct_weight: float = field(
        default=1.0, metadata={"help": "weight of the correctness score (0..1) in the reward"}
    )
    function: str | None = field(
        default=None,
        metadata={
            "help": "optional 'module:function' or 'path/to/file.py:function', called as "
            "f(prompt, response) -> float with the data.Prompt (its ground_truth, data_source, "
            "extra_info, messages), or, where it takes a solution_str parameter, as VERL's "
            "compute_score(data_source, solution_str, ground_truth, extra_info) -> float or "
            "{'score': float, ...}, or, where it takes completions, as TRL's f(prompts, "
            "completions, **columns) -> list of floats, a batch at a time; replaces the built-in correctness score (the format reward is "
            "still added unless format_weight=0); trusted code: the module is imported and run"
        },
    )
    rule_weight: float = field(
        default=1.0,
        metadata={
            "help": "weight of the rule reward (correctness and format above) in the total; 0 skips "
            "correctness (prompts then need no ground truth), the format part is still reported"
        },
    )
    model: str | None = field(
        default=None,
        metadata={
            "help": "local sequence-classification checkpoint directory scoring (prompt, response) "
            "pairs; its first logit, times model_weight, is added to the reward; a trusted path: "
            "it is loaded with transformers"
        },
    )
    model_weight: float = field(default=1.0, metadata={"help": "weight of the reward model's score"})
    model_batch_size: int = field(default=16, metadata={"help": "pairs the reward model scores at once"})
    model_max_tokens: int = field(
        default=2048,
        metadata={"help": "longest pair the reward model reads; longer ones lose their beginning"},
    )

    def __post_init__(self) -> None:
        if self.answer_format not in ANSWER_FORMATS:
            raise ValueError(
                f"answer_format: got {self.answer_format!r}, expected one of {', '.join(ANSWER_FORMATS)}"
            )
        if not 0 <= self.flexible_credit <= 1:
            raise ValueError(f"flexible_credit: got {self.flexible_credit!r}, expected a number in [0, 1]")
        for name in ("format_weight", "correct_weight", "rule_weight", "model_weight"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise ValueError(f"{name}: got {value!r}, expected a finite number >= 0")
        if self.function is not None:
            module, sep, attr = self.function.rpartition(":")
            if not (sep and module and attr):
                raise ValueError(
                    f"function: got {self.function!r}, expected 'module:function' or 'path/to/file.py:function'"
                )
        if self.model is not None and not self.model.strip():
            raise ValueError(f"model: got {self.model!r}, expected a checkpoint directory or null")
        for name in ("model_batch_size", "model_max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: got {value!r}, expected an integer >= 1")
