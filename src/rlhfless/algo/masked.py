"""Statistics over the response tokens of a `[batch, seq]` tensor (`mask` is 1 on them)."""

import torch
from torch import Tensor

__all__ = ["explained_variance", "masked_mean", "masked_var", "whiten"]


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """`sum(x * m) / sum(m)` over all elements; 0 when the mask is empty."""
    return (x * mask).sum() / mask.sum().clamp(min=1e-8)


def masked_var(x: Tensor, mask: Tensor) -> Tensor:
    """Unbiased variance over masked elements: `sum(m * (x - mean)^2) / (sum(m) - 1)`.

    With fewer than two masked elements the sum of squares is 0 and so is the result.
    """
    centered = x - masked_mean(x, mask)
    return (centered.square() * mask).sum() / (mask.sum() - 1).clamp(min=1.0)


def whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """`(x - mean) / sqrt(var + eps)` with the masked mean and unbiased variance; 0 off the mask.

    With `shift_mean=False` the mean is added back: `(x - mean) / sqrt(var + eps) + mean`.
    """
    mean = masked_mean(x, mask)
    out = (x - mean) * torch.rsqrt(masked_var(x, mask) + eps)
    if not shift_mean:
        out = out + mean
    return out * mask


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """`1 - var(returns - values) / var(returns)` over masked tokens (1 perfect, 0 no better
    than a constant, negative worse); not finite when the returns do not vary."""
    return 1.0 - masked_var(returns - values, mask) / masked_var(returns, mask)
