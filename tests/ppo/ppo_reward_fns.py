"""Reward functions the PPO tests name as `reward.function` (random tiny models rarely score)."""


def odd_share(prompt, response: str) -> float:
    """Share of characters with an odd code point: about 0.5 for random text, varying from sample to
    sample, so rewards, returns and advantages vary too."""
    return sum(ord(c) % 2 for c in response) / max(len(response), 1)


def odd_share_rescaled(prompt, response: str) -> float:
    """`odd_share` on another scale and level: 10 x it, minus 3."""
    return 10.0 * odd_share(prompt, response) - 3.0
