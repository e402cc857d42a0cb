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
    correct_weight: float = field(
        default=1.0, metadata={"help": "weight of the correctness score (0..1) in the reward"}
    )
    function: str | None = field(
        default=None,
        metadata={
            "help": "optional 'module:function' called as f(prompt, response) -> float; replaces the "
            "built-in correctness score (the format reward is still added unless format_weight=0)"
        },
    )

    def __post_init__(self) -> None:
        if self.answer_format not in ANSWER_FORMATS:
            raise ValueError(
                f"answer_format: got {self.answer_format!r}, expected one of {', '.join(ANSWER_FORMATS)}"
            )
        for name in ("format_weight", "correct_weight"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise ValueError(f"{name}: got {value!r}, expected a finite number >= 0")
        if self.function is not None:
            module, sep, attr = self.function.partition(":")
            if not (sep and module and attr):
                raise ValueError(f"function: got {self.function!r}, expected 'module:function'")
