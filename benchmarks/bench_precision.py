"""float32 against bfloat16 compute on this machine, side by side in one run: one learning pass of
the default learner on 32 samples (`model.compute_dtype`), and one decode function's generation of a
default step's shape (8 prompts x 4 samples, 160 new tokens) on a model in each dtype, alternating;
and, first, whether each dtype keeps a sequence's tokens when its batch changes (8 prompts x 2
samples in one batch, then each prompt alone). Rollouts stay float32 (`runtime/precision.py` says
why): the generation row is what a bfloat16 rollout would buy, not what a run does.

    .venv/bin/python benchmarks/bench_precision.py [--repeats 2] [--threads 1] [key=value ...]

Prompts and responses are random token ids of the default preset's lengths, so every sequence
runs to the cap (the sampler's hashing is then at its dearest: no token is pruned). Prints each
repeat's seconds and the float32/bfloat16 ratios of their means, with the load average before and
after (the machine may be shared). Whether bfloat16 pays depends on the CPU: with AMX or
AVX512-BF16 it is native, elsewhere emulated (`devices.native_bfloat16`, printed).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import statistics
import time

import numpy as np
import torch

from rlhfless.config import load_config
from rlhfless.devices import native_bfloat16
from rlhfless.engine import Engine, SamplingParams
from rlhfless.engine.sequences import Request
from rlhfless.models import load_model, load_tokenizer
from rlhfless.runtime.executor import build_learner
from rlhfless.runtime.samples import Sample

DTYPES = ("float32", "bfloat16")


def generation_s(model: torch.nn.Module, tokenizer, prompts: list[list[int]], cfg) -> float:
    engine = Engine(model, eos_token_ids=[-1], pad_token_id=tokenizer.pad_token_id)  # never stops early
    params = SamplingParams(max_new_tokens=cfg.generation.max_new_tokens, seed=cfg.seed)
    requests = [Request(f"p{i}", ids, cfg.algorithm.group_size) for i, ids in enumerate(prompts)]
    start = time.perf_counter()
    with torch.inference_mode():
        engine.generate(requests, params, step=1)
    return time.perf_counter() - start


def batch_invariance(model: torch.nn.Module, tokenizer, new_tokens: int = 32) -> tuple[int, int]:
    """8 prompts x 2 samples decoded in one batch, then each prompt alone, on `model` as it is
    (device, dtype): (sequences, identical). No schedule may change a sample, so a rollout dtype
    must keep all of them."""
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, top_p=1.0, seed=11)
    g = torch.Generator().manual_seed(5)
    vocab = int(model.config.vocab_size)
    requests = [
        Request(f"p{i}", torch.randint(9, vocab, (12 + 3 * i,), generator=g).tolist(), 2) for i in range(8)
    ]

    def decode(batch: list[Request]) -> dict:
        engine = Engine(model, eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id)
        return {(r.uid, r.sample): r.response_ids for r in engine.generate(batch, params, 1)}

    together = decode(requests)
    alone: dict = {}
    for request in requests:
        alone |= decode([request])
    return len(together), sum(alone[k] == v for k, v in together.items())


def learning_s(policy: torch.nn.Module, cfg, samples: list[Sample], advantages: list[torch.Tensor]) -> float:
    learner = build_learner(cfg, copy.deepcopy(policy).train(), pad_id=0)
    start = time.perf_counter()
    learner.learn(samples, advantages, None)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="default")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a decode function's: 1)")
    parser.add_argument("--prompt-tokens", type=int, default=150, help="the default prompts' length, about")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(preset=args.preset, overrides=tuple(args.overrides))
    tokenizer = load_tokenizer(cfg.model)
    policy = load_model(cfg.model, len(tokenizer), cfg.seed)
    rng = np.random.default_rng(0)
    vocab = int(policy.config.vocab_size)
    prompts = [rng.integers(100, vocab, args.prompt_tokens).tolist() for _ in range(cfg.data.batch_size)]
    samples = [
        Sample(f"p{i}", s, prompts[i], rng.integers(100, vocab, int(rng.integers(40, 160))).tolist(), "stop")
        for i in range(len(prompts))
        for s in range(cfg.algorithm.group_size)
    ]
    advantages = [torch.full((len(s.response_ids),), float(rng.normal())) for s in samples]
    load = os.getloadavg()
    print(
        f"native bfloat16 on this CPU: {native_bfloat16()}; torch threads {args.threads}; load {load[0]:.2f}"
    )
    for name in DTYPES:
        n, same = batch_invariance(copy.deepcopy(policy).to(getattr(torch, name)), tokenizer)
        print(f"{name:9s} rollouts, one batch against each prompt alone: {same}/{n} sequences identical")
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(args.repeats):
        for name in DTYPES:
            run = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, compute_dtype=name))
            rollout = copy.deepcopy(policy).to(getattr(torch, name))
            gen = generation_s(rollout, tokenizer, prompts, run)
            learn = learning_s(policy, run, samples, advantages)
            times.setdefault(("generation", name), []).append(gen)
            times.setdefault(("learning", name), []).append(learn)
            print(f"repeat {r + 1} {name:9s} generation {gen:6.1f} s   learning {learn:6.1f} s", flush=True)
    print(f"\nmeans over {args.repeats} repeats (load before {load[0]:.2f}, after {os.getloadavg()[0]:.2f})")
    for phase in ("generation", "learning"):
        fp32, bf16 = (statistics.fmean(times[phase, name]) for name in DTYPES)
        print(
            f"  {phase:10s} float32 {fp32:6.1f} s   bfloat16 {bf16:6.1f} s   float32/bfloat16 {fp32 / bf16:.2f}x"
        )


if __name__ == "__main__":
    main()
