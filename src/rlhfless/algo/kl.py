"""Per-token estimators of KL(pi || pi_ref) from the log-probs of sampled tokens (Schulman's k1-k3)."""

import torch
from torch import Tensor

from rlhfless.algo.registry import get_kl_estimator, register_kl

__all__ = ["kl_penalty"]


@register_kl("k1")
def _k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """`logp - ref_logp`: unbiased, high variance, can be negative."""
    return logp - ref_logp


@register_kl("k2")
def _k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """`0.5 * (logp - ref_logp)^2`: biased, low variance, never negative."""
    return 0.5 * (logp - ref_logp).square()


@register_kl("k3")
def _k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """`exp(ref_logp - logp) - (ref_logp - logp) - 1`: unbiased, low variance, never negative."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1


@register_kl("low_var_kl")
def _low_var_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 made safe for training as in VERL: the log-ratio clamped to [-20, 20] before `exp`, the
    result clamped to [-10, 10]."""
    log_ratio = (ref_logp - logp).clamp(min=-20.0, max=20.0)
    return (torch.exp(log_ratio) - log_ratio - 1).clamp(min=-10.0, max=10.0)


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str) -> Tensor:
    """Per-token KL estimate, same shape as `logp`; `kind` names an entry of `KL_ESTIMATORS`:
    `k1` = `logp - ref`, `k2` = `0.5 (logp - ref)^2`, `k3` = `exp(ref - logp) - (ref - logp) - 1`,
    `low_var_kl` = k3 clamped (log-ratio to [-20, 20], result to [-10, 10])."""
    return get_kl_estimator(kind)(logp, ref_logp)
