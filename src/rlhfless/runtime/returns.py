"""What the critic-free estimators learn from: per-token rewards and advantages from scored
samples, and PPO's whitening. The step loop calls them on the whole batch; with a group-local
estimator and one update a step (`group_local`), the Ray executor calls them on each prompt group
as soon as it is scored, to learn it ahead (`learner.Learner.learn_ahead`), and gets the very
values the batch call gives that group.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlhfless.algo import get_advantage_estimator, reinforce_pp_advantages, whiten
from rlhfless.algo.config import AlgorithmConfig
from rlhfless.config import Config
from rlhfless.runtime.samples import Sample

GROUP_LOCAL = ("grpo", "rloo")  # estimators whose advantages of a group read that group alone


def group_local(algo: AlgorithmConfig) -> bool:
    """Whether a prompt group can be learned as soon as it is scored: its advantages read only its
    own rewards, and the step makes one update (no old log-probs, no shuffle across groups)."""
    return algo.name in GROUP_LOCAL and algo.epochs == 1 and algo.mini_batches == 1 and not algo.kl_in_reward


def _padded(per_sample: list[Tensor]) -> tuple[Tensor, Tensor]:
    """Per-sample token tensors as one right-padded [B, R] batch, and its mask."""
    width = max(t.numel() for t in per_sample)
    batch, mask = torch.zeros((len(per_sample), width)), torch.zeros((len(per_sample), width))
    for b, t in enumerate(per_sample):
        batch[b, : t.numel()], mask[b, : t.numel()] = t, 1.0
    return batch, mask


def _unpad(batch: Tensor, like: list[Tensor]) -> list[Tensor]:
    return [batch[b, : t.numel()].clone() for b, t in enumerate(like)]


def token_rewards(
    samples: list[Sample], kl: list[Tensor] | None, beta: float, normalize: bool = False
) -> list[Tensor]:
    """Per-token rewards for the token-level estimators (ppo, reinforce_pp): the sample's reward on
    its last response token, and `-beta * kl_t` on every response token when `kl` is given.
    `normalize` whitens the rewards over the step first (`algorithm.normalize_reward`)."""
    scores = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    if normalize:
        scores = whiten(scores, torch.ones_like(scores))
    out = []
    for i, s in enumerate(samples):
        r = torch.zeros(len(s.response_ids)) if kl is None else -beta * kl[i].float()
        r[-1] += scores[i]
        out.append(r)
    return out


def advantages(cfg: Config, samples: list[Sample], rewards: list[Tensor] | None = None) -> list[Tensor]:
    """Per-token advantages of the critic-free estimators. Sequence-level (grpo, rloo) broadcast
    over each sample's response tokens; reinforce_pp whitens the returns-to-go of `rewards` (the
    token rewards, see `token_rewards`) over the batch. PPO's come from its critic instead."""
    algo = cfg.algorithm
    if algo.name == "reinforce_pp":
        if rewards is None:
            rewards = token_rewards(samples, None, 0.0, algo.normalize_reward)
        batch, mask = _padded(rewards)
        adv, _ = reinforce_pp_advantages(batch, mask, gamma=algo.gamma)
        return _unpad(adv, rewards)
    scores = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    estimator = get_advantage_estimator(algo.name)
    kwargs = {"norm_by_std": algo.norm_adv_by_std} if algo.name == "grpo" else {}
    per_sample = estimator(scores, [s.uid for s in samples], **kwargs)
    return [torch.full((len(s.response_ids),), float(a)) for s, a in zip(samples, per_sample, strict=True)]


def whiten_tokens(per_sample: list[Tensor]) -> list[Tensor]:
    """`whiten` over every response token of the batch (PPO normalises its GAE advantages so)."""
    batch, mask = _padded(per_sample)
    return _unpad(whiten(batch, mask), per_sample)
