"""The `data.` config section: where prompts come from and how many go into each step."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

# One shared system prompt for every prompt: the answer format plus a worked example. Small
# instruct models copy the example's layout, which is what gives them a reward signal at all, and
# the identical prefix is what the engine's prefill dedup computes once per step.
DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant. Think briefly, then give the final answer between "
    "<answer> and </answer> tags.\n"
    "Example:\n"
    "Question: How many legs do 3 dogs have?\n"
    "Response: A dog has 4 legs, so 3 dogs have 3 * 4 = 12 legs. <answer>12</answer>"
)

# Chosen with benchmarks/check_default_signal.py (16 prompts x 4 samples, cap 160, T=1.0): easy
# numeric answers, which the reward's last-number fallback reads before the model learns the tags.
# Half the prompts had reward variance within their group and 19% a sample at least half correct
# (a mix with word answers: 56% and 12%, its variance mostly tiny partial credits); gsm_symbolic
# adds long step-by-step responses, so lengths span 2..160 tokens (median 30, 17% at the cap).
DEFAULT_TASKS: dict[str, float] = {
    "letter_counting": 1.0,
    "chain_sum": 1.0,
    "leg_counting": 1.0,
    "basic_arithmetic": 1.0,
    "gsm_symbolic": 0.5,
}
DEFAULT_TASK_CONFIG: dict[str, dict[str, Any]] = {
    "letter_counting": {"min_words": 3, "max_words": 6},
    "chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    "leg_counting": {"min_animals": 1, "max_animals": 2, "max_instances": 3},
    "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "max_digits": 1, "operators": ["+", "-"]},
}

# Appended to each generated question: a 135M model follows an instruction next to the question
# far more often than one in the system prompt alone.
DEFAULT_ANSWER_REMINDER = "\n\nEnd your reply with the final answer inside <answer></answer> tags."

SOURCES = ("reasoning_gym", "file")
FORMATS = ("auto", "verl", "trl")


def _suggest(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _gym_task_names() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


@dataclass
class DataConfig:
    """Prompt source, mix and batching; validated on construction."""

    source: str = field(
        default="reasoning_gym",
        metadata={"help": "where prompts come from: 'reasoning_gym' (generated) or 'file' (data.path)"},
    )
    tasks: dict[str, float] = field(
        default_factory=lambda: dict(DEFAULT_TASKS),
        metadata={
            "help": "reasoning_gym task name -> mixing weight (share of data.size); source=reasoning_gym"
        },
    )
    task_config: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {k: dict(v) for k, v in DEFAULT_TASK_CONFIG.items()},
        metadata={
            "help": "reasoning_gym task name -> keyword arguments of its dataset config (difficulty); "
            "entries for tasks not in data.tasks are ignored"
        },
    )
    size: int = field(
        default=128,
        metadata={"help": "number of prompts generated (source=reasoning_gym); the same set every epoch"},
    )
    dataset_seed: int = field(
        default=0, metadata={"help": "seed of the generated prompts (independent of the training seed)"}
    )
    path: str | list[str] | None = field(
        default=None,
        metadata={
            "help": "JSONL, Parquet or JSON file of prompts, or a list of them read in order (VERL's "
            "data.train_files); source=file"
        },
    )
    max_file_mb: int = field(
        default=1024,
        metadata={
            "help": "largest data.path read, in MB; a larger file is refused before it is read, since "
            "every prompt is held in memory (the loader shuffles the whole set each epoch)"
        },
    )
    format: str = field(
        default="auto",
        metadata={
            "help": "row layout of data.path: 'verl', 'trl' or 'auto' (verl if rows have reward_model)"
        },
    )
    system_prompt: str = field(
        default=DEFAULT_SYSTEM_PROMPT,
        metadata={
            "help": "system message prepended to prompts that have none (answer format and a worked "
            "example; shared by all prompts); empty string adds none"
        },
    )
    answer_reminder: str = field(
        default=DEFAULT_ANSWER_REMINDER,
        metadata={
            "help": "text appended to every reasoning_gym question (file prompts are kept verbatim); "
            "empty string adds none"
        },
    )
    batch_size: int = field(default=8, metadata={"help": "prompts per training step"})
    shuffle: bool = field(
        default=True, metadata={"help": "reshuffle prompt order every epoch (deterministic from the seed)"}
    )

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"source: got {self.source!r}, expected one of {', '.join(SOURCES)}")
        if self.format not in FORMATS:
            raise ValueError(f"format: got {self.format!r}, expected one of {', '.join(FORMATS)}")
        if not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"size: got {self.size!r}, expected an integer >= 1")
        if (
            isinstance(self.max_file_mb, bool)
            or not isinstance(self.max_file_mb, int)
            or self.max_file_mb < 1
        ):
            raise ValueError(f"max_file_mb: got {self.max_file_mb!r}, expected an integer >= 1")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size: got {self.batch_size!r}, expected an integer >= 1")
        if not isinstance(self.tasks, dict) or not isinstance(self.task_config, dict):
            raise ValueError("tasks/task_config: expected mappings of task name -> value")
        if self.source == "file" and not self.path:
            raise ValueError(
                f"path: got {self.path!r}, expected a JSONL or Parquet file (or a list of them) when "
                "source=file"
            )
        if self.path and self.source != "file":  # else the file would be silently ignored
            raise ValueError(
                f"path: got {self.path!r} with source={self.source!r}, expected source=file to train on it"
            )
        if self.source == "reasoning_gym":
            self._check_tasks()

    def _check_tasks(self) -> None:
        if not self.tasks:
            raise ValueError("tasks: got {}, expected at least one reasoning_gym task with a weight > 0")
        known = _gym_task_names()
        for name, weight in self.tasks.items():
            if name not in known:
                raise ValueError(f"tasks: got {name!r}, expected a reasoning_gym task{_suggest(name, known)}")
            if isinstance(weight, bool) or not isinstance(weight, int | float) or weight < 0:
                raise ValueError(f"tasks.{name}: got {weight!r}, expected a weight >= 0")
        if sum(self.tasks.values()) <= 0:
            raise ValueError(f"tasks: got {self.tasks}, expected at least one weight > 0")
        for name, kwargs in self.task_config.items():
            if name not in known:
                raise ValueError(
                    f"task_config: got {name!r}, expected a reasoning_gym task{_suggest(name, known)}"
                )
            if not isinstance(kwargs, dict):
                raise ValueError(f"task_config.{name}: got {kwargs!r}, expected a mapping of config keywords")
