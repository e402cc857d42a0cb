"""The sampler on the default model's own scores: `gumbel_argmax` against the full Gumbel-max.

A rollout of `bench_engine.py`'s 16 chat prompts x G (temperature 1, top-p 1, packed weights, one
thread) keeps the scores of every `--every`-th batch it samples. Then, side by side on the same
rows: the full Gumbel-max (`scores + gumbel_noise(...)`, argmax: the sampler's definition) and
`gumbel_argmax` (the noise's logarithms only where a token can win), each the best of
`--repeats`. Prints the share of the rollout's decode seconds that sampling took, both times,
their ratio, and how many tokens agree (all must).

    .venv/bin/python benchmarks/bench_sampler.py [--group 2] [--max-new-tokens 96] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import torch
from bench_engine import encode_prompts
from bench_packed import best_ms

import rlhfless.engine.engine as engine_module
from rlhfless.engine import Engine, SamplingParams, rollout
from rlhfless.engine.sampling import gumbel_argmax, gumbel_noise
from rlhfless.models import ModelConfig, load_model, load_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", type=int, default=2, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--every", type=int, default=8, help="sampler calls between two kept batches")
    args = parser.parse_args()
    torch.set_num_threads(1)

    kept: list[torch.Tensor] = []  # every `--every`-th batch's scores, as the sampler sees them
    spent, calls = [0.0], [0]
    sample_tokens = engine_module.sample_tokens

    def keeping(logits: torch.Tensor, params: SamplingParams, seeds: list[int]):
        if calls[0] % args.every == 0 and logits.shape[0] > 1:
            kept.append(torch.log_softmax(logits.float(), dim=-1))
        calls[0] += 1
        start = time.perf_counter()
        out = sample_tokens(logits, params, seeds)
        spent[0] += time.perf_counter() - start
        return out

    engine_module.sample_tokens = keeping
    cfg = ModelConfig()
    tokenizer = load_tokenizer(cfg)
    model = load_model(cfg, len(tokenizer))
    prompts = encode_prompts(tokenizer)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=1.0, seed=11)
    engine = Engine(
        model,
        eos_token_ids=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
        max_running=len(prompts) * args.group,
        max_kv_tokens=1 << 20,
        packed_weights=True,
    )
    _, stats = rollout(engine, prompts, args.group, params, 1, None)
    print(
        f"rollout: {len(prompts)} prompts x {args.group}, {stats.decode_steps} decode steps, "
        f"decode {stats.decode_seconds:.1f} s, of it sampling {spent[0]:.2f} s "
        f"({spent[0] / stats.decode_seconds:.1%})"
    )
    full_ms = pruned_ms = 0.0
    agree = rows = 0
    for i, scores in enumerate(kept):
        seeds = [1000 * i + r for r in range(scores.shape[0])]

        def full(scores: torch.Tensor = scores, seeds: list[int] = seeds) -> torch.Tensor:
            return (scores + gumbel_noise(seeds, scores.shape[-1])).argmax(dim=-1)

        agree += int((gumbel_argmax(scores, seeds) == full()).sum())
        rows += scores.shape[0]
        full_ms += best_ms(full, args.repeats)
        pruned_ms += best_ms(partial(gumbel_argmax, scores, seeds), args.repeats)
    print(f"{len(kept)} kept batches, {rows} rows of {kept[0].shape[-1]} tokens")
    print(f"full Gumbel-max  {full_ms:8.1f} ms")
    print(f"gumbel_argmax    {pruned_ms:8.1f} ms  ({pruned_ms / full_ms:.2f}x)")
    print(f"tokens the same: {agree}/{rows}")


if __name__ == "__main__":
    main()
