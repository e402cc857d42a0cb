"""New weights into a model: its own parameter storage, or wherever they come from."""

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


def load_weights(
    model: torch.nn.Module, weights: dict[str, torch.Tensor] | torch.Tensor, in_place: bool
) -> None:
    """A state dict (copied in place) or one flat vector into `model`: the parameters become views
    of the vector (no copy), unless `in_place` (a CUDA graph reads them where they are)."""
    device = next(model.parameters()).device
    with torch.no_grad():
        if isinstance(weights, torch.Tensor) and in_place:
            copy_into_parameters(model, weights.to(device))
        elif isinstance(weights, torch.Tensor):
            torch.nn.utils.vector_to_parameters(weights.to(device), model.parameters())
        else:
            model.load_state_dict(weights, strict=True)
