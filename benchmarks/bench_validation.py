"""Validation on the driver: the learner's engine as the Ray executor builds it (plain linear
layers: it only prefills in training) against one with reordered weights
(`generation.packed_weights`), side by side.

Workload: the default preset's held-out set (`validation.size` reasoning-gym prompts, greedy, cap
`generation.max_new_tokens`), SmolLM2-135M-Instruct in float32, at the Ray driver's torch threads
(`runtime.threads_per_actor`). Sides alternate `--repeats` times in one process; prints each side's
best seconds, their ratio, and how many held-out responses came out the same.

    .venv/bin/python benchmarks/bench_validation.py [--size 32] [--repeats 2]
"""

from __future__ import annotations

import argparse
import time

import torch

from rlhfless.config import load_config
from rlhfless.data import load_prompts, load_validation_prompts
from rlhfless.models import load_model, load_tokenizer
from rlhfless.rewards import build_reward_fn
from rlhfless.runtime.executor import build_engine
from rlhfless.runtime.machine import learner_threads
from rlhfless.runtime.trainer import tokenize_prompts
from rlhfless.runtime.validation import Validator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    cfg = load_config(preset="default", overrides=("validation.every=1", f"validation.size={args.size}"))
    torch.set_num_threads(learner_threads(cfg))
    tokenizer = load_tokenizer(cfg.model)
    held_out = load_validation_prompts(cfg.data, None, args.size, load_prompts(cfg.data))
    prompts = tokenize_prompts(held_out, tokenizer, cfg.generation.max_prompt_tokens)
    policy = load_model(cfg.model, len(tokenizer), cfg.seed, "cpu")
    reward = build_reward_fn(cfg.reward)
    sides = {}
    for name, packed in (("plain (Ray driver's engine)", False), ("packed weights", True)):
        side_cfg = load_config(
            preset="default",
            overrides=(f"runtime.executor={'inprocess' if packed else 'ray'}",),
        )
        sides[name] = Validator(cfg, prompts, build_engine(side_cfg, policy, tokenizer), tokenizer, reward)
    best: dict[str, float] = {}
    records: dict[str, list[dict]] = {}
    for _ in range(args.repeats):
        for name, validator in sides.items():
            start = time.perf_counter()
            records[name] = validator.run(0).records
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
    plain, packed = best.values()
    same = sum(a["response"] == b["response"] for a, b in zip(*records.values(), strict=True))
    print(f"{len(prompts)} held-out prompts, greedy, {torch.get_num_threads()} thread(s)")
    for name, seconds in best.items():
        print(f"{name:30s} {seconds:7.2f} s")
    print(
        f"packed / plain: {packed / plain:.2f}; responses the same: {same} of {len(records['packed weights'])}"
    )


if __name__ == "__main__":
    main()
