"""Decode steps of fixed shapes, replayed as CUDA graphs on a GPU.

On a lent H200 (session 27) the engine's decode step was host-bound: the GPU computed 3.6% of
the step, which launched about 975 kernels. A CUDA graph launches a whole forward at once, but
replays fixed shapes over fixed memory. So a step's batch is padded up to a bucket (a power of
two, at most the engine's slots) with rows that feed token 0 at position 0 of free slots, and
its span is the slot cache's whole capacity (the mask hides what no row has reached). A graph
per (bucket, capacity) is captured the first time that shape runs; the engine reserves each
sequence's whole response at admission, so the capacity holds through a step, and copies new
weights into the parameters' storage, so graphs outlive a step. Graphs of older cache buffers
are dropped (their addresses are baked into a graph).

The capture is a function passed in (`cuda_capture` on a GPU), so on a CPU the same padded steps
run eagerly (no capture), or through a stand-in whose replay reruns the captured forward: the
tests show there that padding, the wider span, static inputs and replays change no token, and
that a failed capture falls back to eager steps. The CUDA capture itself needs a GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial

import torch

from rlhfless.engine.forward import decode_forward
from rlhfless.engine.kv import SlotCache

log = logging.getLogger(__name__)


def bucket(batch: int, most: int) -> int:
    """The padded batch of a step of `batch` rows: the next power of two, capped at `most` (the
    engine's slots), never under `batch`."""
    return max(batch, min(1 << (batch - 1).bit_length(), most))


# capture(forward) -> (forward's output now, replay, the buffer each replay writes): `forward` reads
# only tensors that stay put (static inputs, the cache, the weights), so a replay recomputes it.
Capture = Callable[[Callable[[], torch.Tensor]], tuple[torch.Tensor, Callable[[], None], torch.Tensor]]


def cuda_capture(
    forward: Callable[[], torch.Tensor],
) -> tuple[torch.Tensor, Callable[[], None], torch.Tensor]:
    """`forward` run once on a side stream (the warm-up a capture asks for; its output is this
    step's), then captured as a CUDA graph."""
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        first = forward()
    main.wait_stream(side)
    first.record_stream(main)  # read on the main stream: not to be reused before that
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        out = forward()
    return first, graph.replay, out


@dataclass
class _Graph:
    replay: Callable[[], None]
    tokens: torch.Tensor  # [bucket] the inputs it reads
    positions: torch.Tensor
    logits: torch.Tensor  # [bucket, V] what it writes


class StaticDecode:
    """The engine's decode forward at bucketed batches over the whole cache capacity; with a
    `capture` (`cuda_capture` on a GPU), each shape captured once and replayed."""

    def __init__(
        self, model: torch.nn.Module, slots: SlotCache, kind: str, most: int, capture: Capture | None
    ):
        self.model, self.slots, self.kind, self.most, self.capture = model, slots, kind, most, capture
        self._captured: dict[tuple[int, int, int], _Graph] = {}

    @property
    def graphs(self) -> bool:
        """Whether steps are captured and replayed (False also after a capture failed)."""
        return self.capture is not None

    @property
    def captured(self) -> int:
        """Graphs held now."""
        return len(self._captured)

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, span: int) -> torch.Tensor:
        """Logits [B, V] of one decode step of `tokens` [B] at `positions` [B] (all < `span`)."""
        batch = tokens.shape[0]
        size = bucket(batch, self.most)
        self.slots.reserve(size, span)
        pad = size - batch
        if pad:  # token 0 at position 0 of slots no running sequence holds
            tokens = torch.cat((tokens, tokens.new_zeros(pad)))
            positions = torch.cat((positions, positions.new_zeros(pad)))
        width = self.slots.capacity
        if self.capture is None:
            return decode_forward(self.model, self.slots, tokens, positions, self.kind, width)[:batch]
        shape = (size, width, self.slots.version)
        graph = self._captured.get(shape)
        with self._on_device():  # a graph is captured and replayed on its device's current stream
            if graph is None:
                return self._capture(shape, tokens, positions)[:batch]
            graph.tokens.copy_(tokens)
            graph.positions.copy_(positions)
            graph.replay()
            return graph.logits[:batch].clone()

    def _on_device(self) -> AbstractContextManager:
        """The cache's GPU as the current device (the learner's engine sits on the last GPU, where
        another may be current); nothing on a CPU."""
        return torch.cuda.device(self.slots.device) if self.slots.device.type == "cuda" else nullcontext()

    def _capture(self, shape: tuple[int, int, int], tokens: torch.Tensor, positions: torch.Tensor):
        """This step's logits, from the forward that is captured for later steps of this shape (it
        writes this step's keys and values, as any would). A capture that fails leaves the engine
        eager from then on."""
        static_tokens, static_positions = tokens.clone(), positions.clone()
        forward = partial(
            decode_forward, self.model, self.slots, static_tokens, static_positions, self.kind, shape[1]
        )
        try:
            logits, replay, out = self.capture(forward)
        except RuntimeError as err:  # an op the capture refuses: keep generating, eagerly
            log.warning("cuda_graphs: capture failed (%s); decoding without graphs", err)
            self.capture = None
            self._captured.clear()
            return forward()
        self._captured = {k: g for k, g in self._captured.items() if k[2] == shape[2]}
        self._captured[shape] = _Graph(replay, static_tokens, static_positions, out)
        return logits
