"""Turn a DataConfig into the run's prompt list."""

from __future__ import annotations

import json

from rlhfless.data.config import DataConfig
from rlhfless.data.files import load_file_prompts
from rlhfless.data.gym import load_gym_prompts
from rlhfless.data.prompts import Prompt
from rlhfless.inputs import MB


def load_files(cfg: DataConfig, paths: str | list[str]) -> list[Prompt]:
    """Every row of `paths` (a file, or a list of them read in order), in data.format."""
    files = [paths] if isinstance(paths, str) else paths
    max_bytes = cfg.max_file_mb * MB
    return [p for path in files for p in load_file_prompts(path, cfg.format, cfg.system_prompt, max_bytes)]


def load_prompts(cfg: DataConfig) -> list[Prompt]:
    """All prompts of the run, in a fixed order (the loader shuffles per epoch)."""
    if cfg.source == "file":
        return load_files(cfg, cfg.path)
    return load_gym_prompts(
        cfg.tasks, cfg.task_config, cfg.size, cfg.dataset_seed, cfg.system_prompt, cfg.answer_reminder
    )


def load_validation_prompts(
    cfg: DataConfig, path: str | list[str] | None, size: int, training: list[Prompt]
) -> list[Prompt]:
    """The held-out prompts: `path` read as data.path is (in data.format), or `size` reasoning_gym
    prompts of the training mix drawn from seeds of their own, less any whose messages a training
    prompt has (easy tasks repeat questions), so that validation never scores what was trained on."""
    if path:
        return load_files(cfg, path)
    drawn = load_gym_prompts(
        cfg.tasks,
        cfg.task_config,
        size,
        cfg.dataset_seed,
        cfg.system_prompt,
        cfg.answer_reminder,
        split="validation",
    )
    seen = {json.dumps(p.messages, sort_keys=True) for p in training}
    return [p for p in drawn if json.dumps(p.messages, sort_keys=True) not in seen]
