"""The interface a generation engine offers the runtime (the HF engine now, a vLLM one later)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from rlhfless.engine.kv import PrefixKV
from rlhfless.engine.sampling import SamplingParams
from rlhfless.engine.sequences import EngineStats, Progress, Request, SequenceResult, SequenceState


class GenerationEngine(Protocol):
    """Continuous-batching generation with shared-prefix KV and cut/resume of sequences."""

    weight_version: int
    stats: EngineStats

    def prefill(self, prefixes: Sequence[Sequence[int]]) -> list[PrefixKV]: ...

    def add(self, requests: Sequence[Request], params: SamplingParams, step: int) -> None: ...

    def resume(self, states: Sequence[SequenceState], params: SamplingParams, step: int) -> None: ...

    def step(self) -> None: ...

    def progress(self) -> Progress: ...

    def unfinished(self, with_kv: bool = False) -> list[SequenceState]: ...

    def cut(self, with_kv: bool = False) -> list[SequenceState]: ...

    def run(self, until: Callable[[Progress], bool] | None = None) -> list[SequenceResult]: ...

    def take_finished(self) -> list[SequenceResult]: ...

    def generate(
        self, requests: Sequence[Request], params: SamplingParams, step: int
    ) -> list[SequenceResult]: ...

    def set_weights(self, weights: dict[str, torch.Tensor] | torch.Tensor, version: int) -> None: ...

    def snapshot_stats(self) -> EngineStats: ...
