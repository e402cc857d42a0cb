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

On a CPU the same padded steps run eagerly (`graphs=False`), so that tests show that padding
and the wider span change no token; capture itself needs a GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from rlhfless.engine.forward import decode_forward
from rlhfless.engine.kv import SlotCache

log = logging.getLogger(__name__)


def bucket(batch: int, most: int) -> int:
    """The padded batch of a step of `batch` rows: the next power of two, capped at `most` (the
    engine's slots), never under `batch`."""
    return max(batch, min(1 << (batch - 1).bit_length(), most))


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor  # [bucket] the inputs the graph reads
    positions: torch.Tensor
    logits: torch.Tensor  # [bucket, V] what it writes


class StaticDecode:
    """The engine's decode forward at bucketed batches over the whole cache capacity; with
    `graphs`, each shape captured once as a CUDA graph and replayed."""

    def __init__(self, model: torch.nn.Module, slots: SlotCache, kind: str, most: int, graphs: bool):
        if graphs and slots.device.type != "cuda":
            raise ValueError(f"cuda_graphs: the model is on {slots.device}, expected a CUDA device")
        self.model, self.slots, self.kind, self.most, self.graphs = model, slots, kind, most, graphs
        self._captured: dict[tuple[int, int, int], _Graph] = {}

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
        if not self.graphs:
            return decode_forward(self.model, self.slots, tokens, positions, self.kind, width)[:batch]
        shape = (size, width, self.slots.version)
        graph = self._captured.get(shape)
        if graph is None:
            return self._capture(shape, tokens, positions)[:batch]
        graph.tokens.copy_(tokens)
        graph.positions.copy_(positions)
        graph.graph.replay()
        return graph.logits[:batch].clone()

    def _capture(self, shape: tuple[int, int, int], tokens: torch.Tensor, positions: torch.Tensor):
        """This step's logits, computed eagerly on a side stream (the warm-up capture asks for,
        writing this step's keys and values), then the same forward captured for later steps. A
        capture that fails leaves the engine eager from then on."""
        width, device = shape[1], self.slots.device
        main, side = torch.cuda.current_stream(device), torch.cuda.Stream(device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            logits = decode_forward(self.model, self.slots, tokens, positions, self.kind, width)
        main.wait_stream(side)
        logits.record_stream(main)  # read on the main stream: not to be reused before that
        static_tokens, static_positions = tokens.clone(), positions.clone()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                out = decode_forward(
                    self.model, self.slots, static_tokens, static_positions, self.kind, width
                )
        except RuntimeError as err:  # an op the capture refuses: keep generating, eagerly
            log.warning("cuda_graphs: capture failed (%s); decoding without graphs", err)
            self.graphs = False
            self._captured.clear()
            return logits
        self._captured = {k: g for k, g in self._captured.items() if k[2] == shape[2]}
        self._captured[shape] = _Graph(graph, static_tokens, static_positions, out)
        return logits
