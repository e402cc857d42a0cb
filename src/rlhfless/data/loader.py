"""Per-step batches of prompts, reshuffled each epoch, resumable at an exact position."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlhfless.data.prompts import DataError, Prompt


class PromptLoader:
    """Endless iterator of `batch_size`-prompt batches.

    An epoch is one pass over a permutation derived only from (seed, epoch), so a resumed run
    that restores (epoch, position) sees exactly the batches an uninterrupted run would. The last
    `len(prompts) % batch_size` prompts of each epoch's order are dropped, so no batch repeats a
    uid; with shuffle they differ every epoch.
    """

    def __init__(self, prompts: list[Prompt], batch_size: int, seed: int, shuffle: bool = True):
        if batch_size < 1 or batch_size > len(prompts):
            raise DataError(
                f"data.batch_size: got {batch_size}, expected 1..{len(prompts)} (the number of prompts)"
            )
        self.prompts = prompts
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._order_for(0)

    @property
    def batches_per_epoch(self) -> int:
        return len(self.prompts) // self.batch_size

    def _order_for(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.prompts))
        return np.random.default_rng((self.seed, epoch)).permutation(len(self.prompts))

    def __iter__(self) -> PromptLoader:
        return self

    def __next__(self) -> list[Prompt]:
        if self.position + self.batch_size > len(self.prompts):
            self.epoch += 1
            self.position = 0
            self._order = self._order_for(self.epoch)
        indices = self._order[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return [self.prompts[i] for i in indices]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "num_prompts": len(self.prompts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the position; refuses a state saved over a different number of prompts."""
        if state.get("num_prompts", len(self.prompts)) != len(self.prompts):
            raise DataError(
                f"loader state: got num_prompts={state['num_prompts']}, expected {len(self.prompts)} "
                "(the data changed since the checkpoint)"
            )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._order_for(self.epoch)
