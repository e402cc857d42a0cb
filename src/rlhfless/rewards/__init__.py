"""Rewards: reasoning-gym scorers, exact/numeric answer match, or a user function."""

from rlhfless.rewards.answers import extract_answer, format_score
from rlhfless.rewards.config import RewardConfig
from rlhfless.rewards.scoring import RewardError, RewardFn, RewardOutput, build_reward_fn

__all__ = [
    "RewardConfig",
    "RewardError",
    "RewardFn",
    "RewardOutput",
    "build_reward_fn",
    "extract_answer",
    "format_score",
]
