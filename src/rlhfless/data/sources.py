"""Turn a DataConfig into the run's prompt list."""

from __future__ import annotations

from rlhfless.data.config import DataConfig
from rlhfless.data.files import load_file_prompts
from rlhfless.data.gym import load_gym_prompts
from rlhfless.data.prompts import Prompt
from rlhfless.inputs import MB


def load_prompts(cfg: DataConfig) -> list[Prompt]:
    """All prompts of the run, in a fixed order (the loader shuffles per epoch)."""
    if cfg.source == "file":
        return load_file_prompts(cfg.path, cfg.format, cfg.system_prompt, cfg.max_file_mb * MB)
    return load_gym_prompts(
        cfg.tasks, cfg.task_config, cfg.size, cfg.dataset_seed, cfg.system_prompt, cfg.answer_reminder
    )
