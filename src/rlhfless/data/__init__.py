"""Training prompts: reasoning-gym generators or VERL/TRL files, batched per step."""

from rlhfless.data.config import DEFAULT_SYSTEM_PROMPT, DataConfig
from rlhfless.data.loader import PromptLoader
from rlhfless.data.prompts import DataError, Prompt, check_prompt_tokens
from rlhfless.data.sources import load_prompts, load_validation_prompts

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "DataConfig",
    "DataError",
    "Prompt",
    "PromptLoader",
    "check_prompt_tokens",
    "load_prompts",
    "load_validation_prompts",
]
