"""The `runtime.` config section: which executor runs the step's functions."""

from __future__ import annotations

from dataclasses import dataclass, field

EXECUTORS = ("inprocess",)


@dataclass
class RuntimeConfig:
    """Where generation, preparation and learning run."""

    executor: str = field(
        default="inprocess", metadata={"help": f"step executor: one of {', '.join(EXECUTORS)}"}
    )

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor: got {self.executor!r}, expected one of {', '.join(EXECUTORS)}")
