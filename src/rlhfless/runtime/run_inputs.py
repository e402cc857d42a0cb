"""What a run (`rlhfless train`) and its forecast (`plan --run`) load before any work: the tokenizer,
the training and held-out prompts and the policy, every prompt checked against the policy, so that
a prompt too long for it is refused before anything is written."""

from __future__ import annotations

from typing import Any

import torch

from rlhfless.config import Config
from rlhfless.data import Prompt, check_prompt_tokens, load_prompts
from rlhfless.devices import learner_device
from rlhfless.engine.profiling import position_limit
from rlhfless.models import load_model, load_tokenizer
from rlhfless.runtime.validation import held_out_prompts


def check_prompts(cfg: Config, prompts: list[Prompt], tokenizer: Any, policy: torch.nn.Module) -> None:
    """Every prompt fits `generation.max_prompt_tokens` and, with `max_new_tokens`, the policy's
    positions (`data.check_prompt_tokens`): before a run or a forecast writes anything."""
    gen = cfg.generation
    check_prompt_tokens(prompts, tokenizer, gen.max_prompt_tokens, position_limit(policy), gen.max_new_tokens)


def load_inputs(cfg: Config) -> tuple[Any, list[Prompt], list[Prompt], torch.nn.Module]:
    """What a run and its forecast start from: the tokenizer, the training and held-out prompts,
    and the policy on the run's device, every prompt checked against it (`check_prompts`)."""
    tokenizer = load_tokenizer(cfg.model)
    prompts = load_prompts(cfg.data)
    held_out = held_out_prompts(cfg, prompts)
    policy = load_model(cfg.model, len(tokenizer), cfg.seed, learner_device(cfg.runtime.device))
    check_prompts(cfg, prompts + held_out, tokenizer, policy)
    return tokenizer, prompts, held_out, policy
