"""Advantage estimators: outcome-level (GRPO, RLOO) and token-level (GAE, REINFORCE++).

Outcome estimators take one reward per sample and `group_ids` (samples answering the same prompt
share an id) and return one advantage per sample; the caller broadcasts it over the response
tokens. Token estimators take `[batch, seq]` rewards and return `(advantages, returns)`.
"""

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from rlhfless.algo.masked import whiten
from rlhfless.algo.registry import register_advantage, register_algorithm

__all__ = ["gae", "grpo_advantages", "reinforce_pp_advantages", "rloo_advantages"]


def _float_rewards(rewards: Tensor) -> Tensor:
    rewards = torch.as_tensor(rewards)
    if rewards.dim() != 1:
        raise ValueError(f"rewards: got shape {tuple(rewards.shape)}, expected one reward per sample (1-D)")
    return rewards if rewards.is_floating_point() else rewards.to(torch.get_default_dtype())


def _group_index(group_ids: Tensor | Sequence[Hashable], n: int, device: torch.device) -> tuple[Tensor, int]:
    """Dense group index 0..G-1 per sample and G, from ids given as a tensor or any hashables."""
    if isinstance(group_ids, Tensor):
        if group_ids.shape != (n,):
            raise ValueError(f"group_ids: got shape {tuple(group_ids.shape)}, expected ({n},)")
        unique, index = torch.unique(group_ids, return_inverse=True)
        return index.to(device), unique.numel()
    ids = list(group_ids)
    if len(ids) != n:
        raise ValueError(f"group_ids: got {len(ids)} ids, expected {n} (one per reward)")
    dense: dict[Hashable, int] = {}
    index = [dense.setdefault(g, len(dense)) for g in ids]
    return torch.tensor(index, dtype=torch.long, device=device), len(dense)


def _group_sum(x: Tensor, index: Tensor, n_groups: int) -> Tensor:
    """For each sample, the sum of `x` over the samples of its group."""
    return x.new_zeros(n_groups).index_add(0, index, x)[index]


@register_algorithm("grpo")
@register_advantage("grpo")
def grpo_advantages(
    rewards: Tensor,
    group_ids: Tensor | Sequence[Hashable],
    eps: float = 1e-6,
    norm_by_std: bool = True,
) -> Tensor:
    """GRPO: `A_i = (r_i - mean_g) / (std_g + eps)`, or `r_i - mean_g` when `norm_by_std=False`
    (Dr. GRPO), with `mean_g` and the unbiased `std_g = sqrt(sum_j (r_j - mean_g)^2 / (n_g - 1))`
    over the samples `j` of the group `g` of sample `i`.

    A group of one sample has nothing to compare against and gets advantage 0.
    """
    rewards = _float_rewards(rewards)
    index, n_groups = _group_index(group_ids, rewards.numel(), rewards.device)
    n = _group_sum(torch.ones_like(rewards), index, n_groups)
    dev = rewards - _group_sum(rewards, index, n_groups) / n
    if not norm_by_std:
        return dev
    std = (_group_sum(dev.square(), index, n_groups) / (n - 1).clamp(min=1.0)).sqrt()
    return dev / (std + eps)


@register_algorithm("rloo")
@register_advantage("rloo")
def rloo_advantages(rewards: Tensor, group_ids: Tensor | Sequence[Hashable]) -> Tensor:
    """RLOO: `A_i = r_i - (sum_{j in g, j != i} r_j) / (n_g - 1) = n_g / (n_g - 1) * (r_i - mean_g)`,
    the reward minus the mean of the other samples of its group; a group of one gets 0."""
    rewards = _float_rewards(rewards)
    index, n_groups = _group_index(group_ids, rewards.numel(), rewards.device)
    n = _group_sum(torch.ones_like(rewards), index, n_groups)
    loo_mean = (_group_sum(rewards, index, n_groups) - rewards) / (n - 1).clamp(min=1.0)
    return torch.where(n > 1, rewards - loo_mean, torch.zeros_like(rewards))


# The baseline of these is the rest of the prompt's group: `algorithm.group_size` must be >= 2.
grpo_advantages.group_relative = True  # type: ignore[attr-defined]
rloo_advantages.group_relative = True  # type: ignore[attr-defined]


def _check_token_shapes(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    first = next(iter(shapes.values()))
    if len(first) != 2 or any(s != first for s in shapes.values()):
        raise ValueError(f"shapes: got {shapes}, expected equal [batch, seq] shapes")


@register_algorithm("ppo")
@register_advantage("gae")
def gae(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over response tokens, not whitened (see `whiten`).

    For response tokens `t < t'` consecutive in the mask (gaps are skipped):
    `delta_t = r_t + gamma * V_{t'} - V_t`, `A_t = delta_t + gamma * lam * A_{t'}`, where the value
    and advantage after a sequence's last response token are 0. Returns `(A, A + V)`; `A` is 0
    off the mask (so the returns there equal the values and must stay masked).
    """
    _check_token_shapes(rewards=rewards, values=values, mask=mask)
    mask = mask.to(values.dtype)
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        next_value = m * values[:, t] + (1 - m) * next_value
        next_adv = m * adv + (1 - m) * next_adv
        advantages[:, t] = m * adv
    return advantages, advantages + values


@register_algorithm("reinforce_pp")
@register_advantage("reinforce_pp")
def reinforce_pp_advantages(
    token_rewards: Tensor, mask: Tensor, gamma: float = 1.0, eps: float = 1e-8
) -> tuple[Tensor, Tensor]:
    """REINFORCE++: no critic, no groups; the return-to-go of each token, whitened over the batch.

    `token_rewards[b, t]` holds the sequence reward on the last response token and, when the
    caller folds in the KL penalty, `-beta * kl_t` on every response token. Then
    `G_t = sum_{k >= t, k in mask} gamma^(#mask tokens in (t, k]) * r_k` (the running return stops at
    the end of the response) and `A = whiten(G, mask)` over all response tokens of the batch
    (unbiased variance). Returns `(A, G)`, both 0 off the mask.
    """
    _check_token_shapes(token_rewards=token_rewards, mask=mask)
    mask = mask.to(token_rewards.dtype)
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        m = mask[:, t]
        running = m * (token_rewards[:, t] + gamma * running) + (1 - m) * running
        returns[:, t] = m * running
    return whiten(returns, mask, eps=eps), returns
