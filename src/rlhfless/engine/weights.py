"""New weights into a model's own parameter storage."""

from __future__ import annotations

import torch


def copy_into_parameters(model: torch.nn.Module, flat: torch.Tensor) -> None:
    """`flat` copied into `model`'s own parameter storage, in `parameters()` order. Unlike
    `vector_to_parameters` the parameters never become views of `flat` (a read-only object-store
    buffer, or one storage that tied weights and safetensors would then share), and they stay
    where they are (a CUDA graph reads them there)."""
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    if total != flat.numel():
        raise ValueError(f"weights: got {flat.numel()} values, expected {total} (the model's parameters)")
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
