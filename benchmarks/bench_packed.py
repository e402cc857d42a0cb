"""Reordered linear weights (`generation.packed_weights`) against the plain layers, side by side.

Workload: the default preset's first `--prompts` reasoning-gym prompts x `--group` samples, sampled
at temperature 1 up to `--max-new-tokens` in one engine (continuous batching), SmolLM2-135M-Instruct
in float32 on this CPU. Runs alternate plain / packed `--repeats` times in one process (the
machine's drift falls on both) and print, per side, the best generation wall seconds, decode
seconds, prefill seconds and the reorder's seconds, their ratio, and how many sequences came out
token-identical between the two. A second table times one bare linear layer of each of the
model's shapes at a few row counts, `F.linear` against the reordered weight.

    .venv/bin/python benchmarks/bench_packed.py [--threads 1] [--repeats 2] [--max-new-tokens 160]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from rlhfless.data.config import DataConfig
from rlhfless.data.sources import load_prompts
from rlhfless.engine import Engine, Request, SamplingParams
from rlhfless.engine.packed import ROWS_HINT
from rlhfless.models import ModelConfig, load_model, load_tokenizer


def best_ms(fn, repeats: int = 15) -> float:
    fn()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return min(runs) * 1e3


def layer_table(model: torch.nn.Module) -> None:
    shapes = sorted({tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)})
    print("\n== one linear layer, F.linear against the reordered weight (best of 15, ms) ==")
    print(f"{'out x in':>14}{'rows':>6}{'F.linear':>10}{'reordered':>11}{'ratio':>8}")
    generator = torch.Generator().manual_seed(0)
    for out_f, in_f in shapes:
        weight = torch.randn(out_f, in_f, generator=generator) * 0.02
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, ROWS_HINT)
        for rows in (1, 8, 32):
            x = torch.randn(rows, in_f, generator=generator)
            plain = best_ms(lambda x=x, w=weight: F.linear(x, w))
            fast = best_ms(
                lambda x=x, w=packed: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
            )
            print(f"{out_f:>7} x {in_f:<4}{rows:>6}{plain:>10.3f}{fast:>11.3f}{fast / plain:>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    cfg = ModelConfig()
    tokenizer = load_tokenizer(cfg)
    model = load_model(cfg, len(tokenizer))
    requests = []
    for prompt in load_prompts(DataConfig())[: args.prompts]:
        ids = tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        requests.append(Request(prompt.uid, list(ids), args.group))
    params = SamplingParams(args.max_new_tokens, temperature=1.0, top_p=1.0, seed=3)
    n_seq = args.prompts * args.group
    print(
        f"model {cfg.path}, float32, {torch.get_num_threads()} thread(s); {args.prompts} prompts x "
        f"{args.group}, up to {args.max_new_tokens} new tokens, one engine of {n_seq} slots"
    )

    best: dict[bool, dict[str, float]] = {}
    tokens: dict[bool, list] = {}
    for _ in range(args.repeats):
        for packed in (False, True):
            engine = Engine(
                model,
                eos_token_ids=[tokenizer.eos_token_id],
                pad_token_id=tokenizer.pad_token_id,
                max_running=n_seq,
                max_kv_tokens=1 << 20,
                packed_weights=packed,
            )
            start = time.perf_counter()
            with engine.linears:  # the reorder alone (the run's first forward would do it)
                pass
            reorder = time.perf_counter() - start
            results = engine.generate(requests, params, step=0)
            wall = time.perf_counter() - start
            stats = engine.snapshot_stats()
            row = {
                "generation s": wall,
                "decode s": stats.decode_seconds,
                "prefill s": stats.prefill_seconds,
                "reorder s": reorder,
            }
            side = best.setdefault(packed, row)
            for name, value in row.items():
                side[name] = min(side[name], value)
            tokens[packed] = [r.response_ids for r in results]
            print(f"  {'packed' if packed else 'plain '}: {wall:.1f} s, {stats.tokens_generated} tokens")
    print(f"\n== generation, best of {args.repeats} ==")
    print(f"{'':16}{'plain':>10}{'packed':>10}{'packed/plain':>14}")
    for name in best[False]:
        plain, packed = best[False][name], best[True][name]
        ratio = f"{packed / plain:14.2f}" if plain else f"{'-':>14}"  # the plain side reorders nothing
        print(f"{name:16}{plain:>10.2f}{packed:>10.2f}{ratio}")
    same = sum(a == b for a, b in zip(tokens[False], tokens[True], strict=True))
    print(f"sequences token-identical, plain against packed: {same}/{n_seq}")
    layer_table(model)


if __name__ == "__main__":
    main()
