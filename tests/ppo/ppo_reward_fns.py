"""Reward functions the PPO tests name as `reward.function` (random tiny models rarely score)."""


def vowel_share(prompt, response: str) -> float:
    """Share of vowels in the response: varies from sample to sample, so returns vary too."""
    return sum(c in "aeiou" for c in response) / max(len(response), 1)
