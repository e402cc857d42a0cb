"""The generation engine on the default model: dedup prefill, continuous batching, placement invariance.

Workload: GRPO, G=4, 16 chat prompts sharing one system prompt, sampled at temperature 1 (top-p 1)
up to `--max-new-tokens`; SmolLM2-135M-Instruct, float32, CPU (or the GPU when there is one), the
engine's linear weights reordered as the runtime's decode functions run them (`--plain-weights`: not).
Prints, side by side, wall seconds and this process's CPU seconds (the machine is shared: CPU
seconds show the work done, wall seconds what other load adds):
- prefill seconds and prompt tokens with dedup (planner prefix = the shared system prompt) vs
  without (every sample prefills its full prompt), from runs that sample one token only (no
  decode step), best of `--repeats`; goal: >= 60% fewer prefill seconds;
- generated tokens per second of the engine (continuous batching, dedup off, so only batching
  differs) vs Hugging Face `generate` on the same 64 sequences in one batch, end to end and decode
  only (minus a prefill-only run for HF; the engine's own decode seconds); goal: >= 1.3x;
- the share of sequences that came out identical across placements: dedup on vs off (different
  prefill batches), and cut at half the sequences finished then resumed by re-prefill on another
  engine with fewer slots; goal: >= 99%.

    .venv/bin/python benchmarks/bench_engine.py [--max-new-tokens 128] [--threads 1] [--repeats 2] [--skip-hf]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

from rlhfless.engine import Engine, PrefixTree, Request, SamplingParams, SequenceResult, rollout
from rlhfless.models import ModelConfig, load_model, load_tokenizer

SYSTEM = (
    "You are a careful and concise assistant for a school math and reasoning club. Read the question, "
    "think about what is being asked, and answer in plain words. Show the key step of your reasoning in "
    "one or two sentences, then give the final answer on its own line. If a question is ambiguous, say "
    "which reading you chose. Never make up facts; if you do not know, say so."
)
QUESTIONS = [
    "What is 17 + 25?",
    "A train travels 60 km in 1.5 hours. What is its average speed?",
    "Name three prime numbers greater than 20.",
    "If a shirt costs $20 and is 25% off, what do you pay?",
    "Write a short poem about the number zero.",
    "What is the next number: 2, 4, 8, 16, ...?",
    "Explain why the sum of two odd numbers is even.",
    "How many minutes are in a day?",
    "Sort these words alphabetically: pear, apple, mango, banana.",
    "What is 9 times 7?",
    "A rectangle is 4 cm by 6 cm. What is its area and perimeter?",
    "Is 91 a prime number? Explain.",
    "Tell a one-sentence story about a robot learning to count.",
    "What is half of one third?",
    "Convert 3 hours and 20 minutes to minutes.",
    "List the first five square numbers.",
]


def encode_prompts(tokenizer) -> list[tuple[str, list[int]]]:
    out = []
    for i, question in enumerate(QUESTIONS):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if not isinstance(ids, list) else ids
        out.append((f"q{i}", list(ids)))
    return out


def common_prefix_length(prompts: list[list[int]]) -> int:
    n = 0
    while all(len(p) > n and p[n] == prompts[0][n] for p in prompts):
        n += 1
    return n


def identical_share(a: list[SequenceResult], b: list[SequenceResult]) -> float:
    left = {(r.uid, r.sample): r.response_ids for r in a}
    right = {(r.uid, r.sample): r.response_ids for r in b}
    return sum(left[k] == right.get(k) for k in left) / len(left)


def hf_generate(model, tokenizer, prompts, group, params) -> int:
    """Generated (non-padding, up to and including EOS) tokens of one `generate` call."""
    rows = [ids for _, ids in prompts for _ in range(group)]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    eos = tokenizer.eos_token_id
    torch.manual_seed(params.seed)
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids.to(model.device),
            attention_mask=mask.to(model.device),
            max_new_tokens=params.max_new_tokens,
            do_sample=True,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=0,
            eos_token_id=eos,
            pad_token_id=pad,
        )
    tokens = 0
    for row in out[:, width:].tolist():
        tokens += row.index(eos) + 1 if eos in row else len(row)
    return tokens


def timed(fn):
    """fn()'s result, wall seconds and this process's CPU seconds (steadier on a shared machine)."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--group", type=int, default=4, help="samples per prompt (GRPO G)")
    parser.add_argument("--repeats", type=int, default=2, help="prefill-only runs per side (best is kept)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--skip-hf", action="store_true", help="skip the Hugging Face generate baseline")
    parser.add_argument(
        "--plain-weights",
        action="store_true",
        help="the engine's linear layers as they are (default: reordered, as generation.packed_weights)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    cfg = ModelConfig()
    tokenizer = load_tokenizer(cfg)
    model = load_model(cfg, len(tokenizer)).to(args.device)
    prompts = encode_prompts(tokenizer)
    shared = common_prefix_length([ids for _, ids in prompts])
    system = PrefixTree([prompts[0][1][:shared]], [-1], {uid: 0 for uid, _ in prompts})  # one level
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=1.0, seed=11)
    n_seq, group = len(prompts) * args.group, args.group

    def engine(max_running: int = n_seq) -> Engine:
        return Engine(
            model,
            eos_token_ids=[tokenizer.eos_token_id],
            pad_token_id=tokenizer.pad_token_id,
            max_running=max_running,
            max_kv_tokens=1 << 20,
            packed_weights=not args.plain_weights,
        )

    print(
        f"model {cfg.path} on {args.device}, {torch.get_num_threads()} threads; {len(prompts)} prompts x "
        f"G={group}, prompt tokens {min(len(p) for _, p in prompts)}-{max(len(p) for _, p in prompts)}, "
        f"shared prefix {shared}, max_new_tokens {args.max_new_tokens}"
    )
    engine().generate([Request("warmup", prompts[0][1])], SamplingParams(4), step=0)

    # Prefill alone: one new token per sample, so no decode step runs.
    first_token = replace(params, max_new_tokens=1)
    best = {"on": [float("inf")] * 2, "off": [float("inf")] * 2}
    computed = {}
    for _ in range(args.repeats):
        for side, tree in (("on", system), ("off", None)):
            (_, stats), _, cpu = timed(
                lambda tree=tree: rollout(engine(), prompts, group, first_token, 1, tree)
            )
            best[side] = [min(best[side][0], stats.prefill_seconds), min(best[side][1], cpu)]
            computed[side] = stats.prompt_tokens_computed
    print(f"\n== prefill (G={group}, {len(prompts)} prompts): dedup on vs off, best of {args.repeats} ==")
    print(f"{'':24}{'dedup on':>12}{'dedup off':>12}{'on/off':>10}")
    rows = (
        ("prompt tokens computed", computed),
        ("prefill wall seconds", {k: v[0] for k, v in best.items()}),
    )
    rows += (("prefill CPU seconds", {k: v[1] for k, v in best.items()}),)
    for name, value in rows:
        print(f"{name:24}{value['on']:>12.3f}{value['off']:>12.3f}{value['on'] / value['off']:>10.3f}")
    print(
        f"prefill seconds saved: {1 - best['on'][0] / best['off'][0]:.1%} wall, "
        f"{1 - best['on'][1] / best['off'][1]:.1%} CPU (goal >= 60%)"
    )

    (off, off_stats), off_wall, off_cpu = timed(lambda: rollout(engine(), prompts, group, params, 1, None))
    (on, on_stats), on_wall, on_cpu = timed(lambda: rollout(engine(), prompts, group, params, 1, system))
    lengths = sorted(len(r.response_ids) for r in off)
    print(
        f"\nresponse lengths (engine): median {lengths[len(lengths) // 2]}, max {lengths[-1]}, "
        f"at cap {sum(n >= args.max_new_tokens for n in lengths)}/{len(lengths)}; decode steps {off_stats.decode_steps}"
    )
    if not args.skip_hf:
        hf_tokens, hf_wall, hf_cpu = timed(lambda: hf_generate(model, tokenizer, prompts, group, params))
        _, hf_prefill_wall, hf_prefill_cpu = timed(
            lambda: hf_generate(model, tokenizer, prompts, group, first_token)
        )
        print("\n== generated tokens per second on one long-tail batch (all sequences admitted at once) ==")
        print(
            f"{'':36}{'tokens':>8}{'wall s':>9}{'CPU s':>9}{'tok/s wall':>12}{'x HF':>6}{'tok/s CPU':>11}{'x HF':>6}"
        )
        # decode only: without the first token of each sequence, which its prefill produces
        rows = (
            ("HF generate", hf_tokens, hf_wall, hf_cpu),
            ("engine: continuous batching", off_stats.tokens_generated, off_wall, off_cpu),
            ("engine: continuous batching + dedup", on_stats.tokens_generated, on_wall, on_cpu),
            (
                "HF generate, decode only",
                hf_tokens - n_seq,
                hf_wall - hf_prefill_wall,
                hf_cpu - hf_prefill_cpu,
            ),
            (
                "engine: cont. batching, decode only",
                off_stats.tokens_generated - n_seq,
                off_stats.decode_seconds,
                off_cpu - best["off"][1],
            ),
        )
        rates = [(tokens / wall, tokens / cpu) for _, tokens, wall, cpu in rows]
        for i, (name, tokens, wall, cpu) in enumerate(rows):
            base = rates[0] if i < 3 else rates[3]
            print(
                f"{name:36}{tokens:>8}{wall:>9.1f}{cpu:>9.1f}{rates[i][0]:>12.1f}{rates[i][0] / base[0]:>6.2f}"
                f"{rates[i][1]:>11.1f}{rates[i][1] / base[1]:>6.2f}"
            )
        print(
            f"continuous batching vs HF generate: {rates[1][0] / rates[0][0]:.2f}x wall, "
            f"{rates[1][1] / rates[0][1]:.2f}x CPU end to end; decode only {rates[4][0] / rates[3][0]:.2f}x wall, "
            f"{rates[4][1] / rates[3][1]:.2f}x CPU (goal >= 1.3x)"
        )

    first = engine(max_running=n_seq // 2)
    first.add([Request(uid, ids, group) for uid, ids in prompts], params, step=1)
    done = first.run(until=lambda p: p.finished >= p.total // 2)
    states = first.cut()
    second = engine(max_running=n_seq // 4)
    second.resume(states, params, step=1)
    moved = done + second.run()
    print("\n== same sequences across placements (sampling, T=1) ==")
    print(f"dedup on vs dedup off:                      {identical_share(on, off):.1%}")
    print(
        f"cut at 50% + resumed elsewhere vs dedup on:  {identical_share(on, moved):.1%} ({len(states)} moved)"
    )
    print(f"cut at 50% + resumed elsewhere vs dedup off: {identical_share(off, moved):.1%}  (goal >= 99%)")


if __name__ == "__main__":
    main()
