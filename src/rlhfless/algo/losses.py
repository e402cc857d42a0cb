"""The PPO clipped surrogate for the policy and the clipped value loss for the critic."""

import torch
from torch import Tensor

from rlhfless.algo.aggregation import aggregate_loss
from rlhfless.algo.masked import masked_mean

__all__ = ["policy_loss", "value_loss"]


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    norm_len: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate, per token, aggregated by `agg` with `norm_len` (see `aggregate_loss`):

    `rho = exp(logp - old_logp)` (log-ratio clamped to [-20, 20] against overflow),
    `L = max(-A rho, -A clip(rho, 1 - clip_low, 1 + clip_high))`, and with `dual_clip = c > 1`
    `L = min(L, -c A)` where `A < 0` (Dual-clip PPO: a token whose ratio has run far up while its
    advantage is negative loses at most `c * |A|`).

    Metrics (detached scalars, token-mean over the mask): `clip_frac`, the share of tokens where
    the clipped term is the larger one; `clip_frac_lower`, the share where the dual clip bounds
    the loss (0 without it); `approx_kl`, `mean(old_logp - logp)`, an estimate of KL(old || new).
    Gradients flow to `logp` only.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip: got {dual_clip}, expected a number > 1 or None")
    mask = mask.to(logp.dtype)
    log_ratio = (logp - old_logp).clamp(min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    dual_bounded = torch.zeros_like(mask)
    if dual_clip is not None:
        bound = -advantages * dual_clip
        negative = advantages < 0
        dual_bounded = (negative & (loss > bound)).to(mask.dtype)
        loss = torch.where(negative, torch.minimum(loss, bound), loss)
    metrics = {
        "clip_frac": masked_mean((clipped > unclipped).to(mask.dtype), mask).detach(),
        "clip_frac_lower": masked_mean(dual_bounded, mask).detach(),
        "approx_kl": masked_mean(-log_ratio, mask).detach(),
    }
    return aggregate_loss(loss, mask, agg, norm_len), metrics


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None = 0.2,
    agg: str = "token-mean",
    norm_len: float | None = None,
) -> Tensor:
    """Clipped value loss, per token, aggregated by `agg` with `norm_len` (see `aggregate_loss`):

    `0.5 * max((v - R)^2, (v_old + clip(v - v_old, -clip, clip) - R)^2)`; with `clip=None` the
    plain `0.5 * (v - R)^2`. The clipped branch keeps the critic from moving far from the values
    the advantages were computed with.
    """
    loss = (values - returns).square()
    if clip is not None:
        clipped = old_values + (values - old_values).clamp(-clip, clip)
        loss = torch.maximum(loss, (clipped - returns).square())
    return aggregate_loss(0.5 * loss, mask, agg, norm_len)
