"""Peak resident memory of one learner step on the default model (SmolLM2-135M, GRPO, 8 prompts x 4
samples of at most 160 tokens), sampled every few milliseconds while the step runs.

    .venv/bin/python benchmarks/learner_memory.py [--threads 1] [--prompt-tokens 128] [trainer.key=value ...]

Prints the resident memory after loading, the peak during the reference log-prob pass and during
the policy update, in GB. Token ids are random (memory does not depend on them); response lengths
are drawn from a fixed seed so that every run packs the same micro-batches.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

import psutil
import torch

from rlhfless.config import load_config
from rlhfless.devices import resolve_device
from rlhfless.models import load_model, load_tokenizer
from rlhfless.runtime.executor import build_learner
from rlhfless.runtime.samples import Sample

GB = 1e9


@contextmanager
def peak_rss(period_s: float = 0.005):
    """Yields a one-item list that holds the peak resident bytes seen until the block ends."""
    proc, peak, done = psutil.Process(), [psutil.Process().memory_info().rss], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(period_s)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        done.set()
        thread.join()


def make_samples(groups: int, group_size: int, prompt_tokens: int, max_new: int, vocab: int) -> list[Sample]:
    g = torch.Generator().manual_seed(0)
    out = []
    for k in range(groups):
        prompt = torch.randint(0, vocab, (prompt_tokens,), generator=g).tolist()
        for s in range(group_size):
            length = int(torch.randint(max_new // 4, max_new + 1, (1,), generator=g))
            response = torch.randint(0, vocab, (length,), generator=g).tolist()
            out.append(Sample(f"u{k}", s, prompt, response, "length"))
    return out


def measure(label: str, fn: Callable[[], object]) -> None:
    start = time.perf_counter()
    with peak_rss() as peak:
        fn()
    print(f"{label}: peak {peak[0] / GB:.2f} GB resident, {time.perf_counter() - start:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. trainer.micro_batch_tokens=1024")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = resolve_device(load_config(preset="default", overrides=tuple(args.overrides)))
    tokenizer = load_tokenizer(cfg.model)
    model = load_model(cfg.model, len(tokenizer), cfg.seed)
    samples = make_samples(
        cfg.data.batch_size,
        cfg.algorithm.group_size,
        args.prompt_tokens,
        cfg.generation.max_new_tokens,
        len(tokenizer),
    )
    learner = build_learner(cfg, model, tokenizer.pad_token_id)
    advantages = [torch.randn(len(s.response_ids)) for s in samples]
    tokens = sum(len(s.response_ids) for s in samples)
    print(
        f"{len(samples)} samples, {tokens} response tokens, micro_batch_tokens {cfg.trainer.micro_batch_tokens}"
    )
    print(f"after load: {psutil.Process().memory_info().rss / GB:.2f} GB resident")
    measure("reference log-probs", lambda: learner.logprobs(model, samples))
    measure("policy update", lambda: learner.learn(samples, advantages, None))
    measure("second update", lambda: learner.learn(samples, advantages, None))


if __name__ == "__main__":
    main()
