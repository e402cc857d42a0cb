"""A CPU engine's linear layers on weights reordered once for oneDNN, not once a call.

A decode step multiplies a few rows (one per running sequence) by every weight matrix. PyTorch's
float32 `F.linear` hands that to MKL's sgemm, which copies the whole weight into its blocked
layout on every call: at 8 rows the default model's vocabulary projection (49,152 x 576) took
2.6x as long as the same product on a weight reordered beforehand (`benchmarks/bench_packed.py`).
Here each `nn.Linear`'s weight is reordered once per weight version (`torch.ops.mkldnn`, the
kernels Inductor's CPU freezing uses) and the engine's forwards run on those copies.

Only inside `with packed:`, so a model shared with a colocated learner trains exactly as
before; float32 weights on a CPU only (elsewhere the layers run as they are). A weight that
changed since it was reordered is reordered again at the next `with`: where its storage changed or
its version counter moved, and for every layer after `stale()` (the engine calls it when its
weight version changes: a fused AdamW step writes the weights in place without moving their
version counters). Costs one reordered copy of the linear weights in memory.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch
import torch.nn.functional as F

ROWS_HINT = 32  # oneDNN's batch-size hint for the reorder; the products' bits do not depend on it


@functools.cache
def available() -> bool:
    """Whether this torch build runs the oneDNN ops on this CPU: tried once on a small product,
    since a build may register them for a CPU whose kernels then refuse (the layers then run as
    they are)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        weight, x = torch.ones(4, 8), torch.ones(2, 8)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, ROWS_HINT)
        out = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return torch.equal(out, F.linear(x, weight))


def _packable(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        type(module) is torch.nn.Linear  # a quantized or otherwise special subclass runs as is
        and weight is not None
        and weight.device.type == "cpu"
        and weight.dtype == torch.float32
    )


def _packed_forward(module: torch.nn.Linear, x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float32:  # under autocast or a cast input: the layer as it is
        return F.linear(x, module.weight, module.bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, module.bias, "none", [], "")


class PackedLinears:
    """Context manager: inside it, `model`'s float32 CPU `nn.Linear` layers multiply by reordered
    copies of their weights. Inactive (nothing changes) when `enabled` is false, when no layer
    qualifies, or when this torch has no oneDNN."""

    def __init__(self, model: torch.nn.Module, enabled: bool = True) -> None:
        linears = [m for m in model.modules() if _packable(m)] if enabled and available() else []
        self.linears: list[torch.nn.Linear] = linears
        self._packed: dict[torch.nn.Linear, tuple[tuple[int, int] | None, torch.Tensor]] = {}

    @property
    def active(self) -> bool:
        return bool(self.linears)

    def stale(self) -> None:
        """The weights changed where no tensor shows it (new weights loaded, a new weight
        version): the next `with` reorders every layer again."""
        self._packed = {layer: (None, copy) for layer, (_, copy) in self._packed.items()}

    def _current(self, layer: torch.nn.Linear) -> torch.Tensor:
        """`layer`'s reordered weight, reordered again where the weight changed since (another
        storage, or written in place: its version counter moved), into the copy it had. A fresh
        copy each step, under PyTorch's huge-page allocator (`runtime/process_env.py`), grew a
        decode function's private memory step after step (1.36 to 2.09 GB in 4 steps)."""
        weight = layer.weight
        key = (weight.data_ptr(), weight._version)
        held = self._packed.get(layer)
        if held is None or held[0] != key:
            with torch.inference_mode():  # the copies are the engine's, written only here
                fresh = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)
                copy = fresh if held is None else held[1].copy_(fresh)
            held = (key, copy)
            self._packed[layer] = held
        return held[1]

    def __enter__(self) -> PackedLinears:
        for layer in self.linears:
            packed = self._current(layer)
            layer.forward = types.MethodType(
                lambda module, x, packed=packed: _packed_forward(module, x, packed), layer
            )
        return self

    def __exit__(self, *exc: Any) -> None:
        for layer in self.linears:
            layer.__dict__.pop("forward", None)  # the class's forward again
