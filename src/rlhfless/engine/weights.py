"""New weights into a model's own parameter storage."""

from __future__ import annotations

import threading

import torch

CHUNK = 1 << 22  # values copied between two looks at a stop signal (16 MB of float32)


def copy_into_parameters(
    model: torch.nn.Module, flat: torch.Tensor, stop: threading.Event | None = None
) -> int:
    """`flat` copied into `model`'s own parameter storage, in `parameters()` order. Unlike
    `vector_to_parameters` the parameters never become views of `flat` (a read-only object-store
    buffer, or one storage that tied weights and safetensors would then share), and they stay
    where they are (a CUDA graph reads them there). Once `stop` is set the copy stops (it looks
    every `CHUNK` values). How many parameters it copied whole, in order: all, unless stopped."""
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    if total != flat.numel():
        raise ValueError(f"weights: got {flat.numel()} values, expected {total} (the model's parameters)")
    offset = 0
    with torch.no_grad():
        for done, p in enumerate(params):
            n = p.numel()
            target = p.view(-1)
            for lo in range(0, n, CHUNK):
                if stop is not None and stop.is_set():
                    return done
                hi = min(n, lo + CHUNK)
                target[lo:hi].copy_(flat[offset + lo : offset + hi])
            offset += n
    return len(params)
