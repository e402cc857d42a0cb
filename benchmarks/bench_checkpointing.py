"""Activation checkpointing off, on every second layer and on every layer, side by side in one
run: one learner rank's share of a default step (SmolLM2-135M, GRPO, 4 prompts x 4 samples of at
most 160 tokens, Adam's states allocated), its update's seconds and its process's peak resident
memory.

    .venv/bin/python benchmarks/bench_checkpointing.py [--repeats 2] [--threads 1] [key=value ...]

Each update runs in a process of its own (a peak is a process's), the settings alternating, so that
the machine's load falls on both alike. Prints each run and the ratios of the means, with the load
average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learner_memory import GB, make_samples, peak_rss  # noqa: E402

SETTINGS = {
    "off": ["model.gradient_checkpointing=false"],
    "every 2nd layer": ["model.gradient_checkpointing=true", "model.checkpoint_every_n_layers=2"],
    "on": ["model.gradient_checkpointing=true"],
}


def child(threads: int, overrides: list[str]) -> None:
    """One process: load, one update to allocate Adam's states, then the timed update."""
    import torch

    from rlhfless.config import load_config
    from rlhfless.devices import resolve_device
    from rlhfless.models import load_model, load_tokenizer
    from rlhfless.runtime.executor import build_learner

    torch.set_num_threads(threads)
    cfg = resolve_device(load_config(preset="default", overrides=tuple(overrides)))
    tokenizer = load_tokenizer(cfg.model)
    model = load_model(cfg.model, len(tokenizer), cfg.seed)
    samples = make_samples(4, cfg.algorithm.group_size, 128, cfg.generation.max_new_tokens, len(tokenizer))
    advantages = [torch.randn(len(s.response_ids)) for s in samples]
    learner = build_learner(cfg, model, tokenizer.pad_token_id)
    with peak_rss() as peak:
        learner.learn(samples, advantages, None)
        start = time.perf_counter()
        learner.learn(samples, advantages, None)
        seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "peak_gb": peak[0] / GB}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="config overrides for both settings")
    args = parser.parse_args()
    if args.child:
        child(args.threads, args.overrides)
        return
    load_before = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    for r in range(args.repeats):
        for name, setting in SETTINGS.items():
            command = [
                sys.executable,
                __file__,
                "--child",
                "--threads",
                str(args.threads),
                *args.overrides,
                *setting,
            ]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
            print(
                f"repeat {r + 1}, checkpointing {name}: {runs[name][-1]['seconds']:.1f} s, "
                f"peak {runs[name][-1]['peak_gb']:.2f} GB resident",
                flush=True,
            )
    mean = {n: {k: statistics.mean(x[k] for x in v) for k in ("seconds", "peak_gb")} for n, v in runs.items()}
    off = mean["off"]
    for name in list(SETTINGS)[1:]:
        m = mean[name]
        print(
            f"checkpointing {name}: update {m['seconds']:.1f} s against {off['seconds']:.1f} s off "
            f"({m['seconds'] / off['seconds']:.2f}x the time), peak {m['peak_gb']:.2f} GB against "
            f"{off['peak_gb']:.2f} GB ({off['peak_gb'] - m['peak_gb']:.2f} GB less)"
        )
    print(f"load average (1 min) before {load_before:.1f}, after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
