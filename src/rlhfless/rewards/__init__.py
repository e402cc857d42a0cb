"""Rewards: reasoning-gym scorers, exact/numeric answer match, or a user function."""

from rlhfless.rewards.answers import extract_answer, format_score
from rlhfless.rewards.config import RewardConfig
from rlhfless.rewards.scoring import RewardError, RewardFn, RewardOutput, build_reward_fn, check_scorable

__all__ = [
    "RewardConfig",
    "RewardError",
    "RewardFn",
    "RewardOutput",
    "build_reward_fn",
    "check_scorable",
    "extract_answer",
    "format_score",
]
