"""A learner rank's update with and without torch's huge pages for large tensors, side by side in
one run: one rank's share of a default step (SmolLM2-135M, GRPO, 4 prompts x 4 samples of at most
160 tokens), its wall, user and system seconds, its minor page faults and its process's peak
resident memory (`runtime/process_env.py`: the Ray functions start with `THP_MEM_ALLOC_ENABLE=1`).

    .venv/bin/python benchmarks/bench_huge_pages.py [--repeats 3] [--threads 1]

Each update runs in a process of its own, the settings alternating, so that the machine's load
falls on both alike; before it, an update on one sample allocates the gradients and Adam's
states, as a rank that has learned once holds them. System seconds and faults are the direct
measure (page faults and the zeroing of fresh pages); wall seconds carry the machine's noise.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learner_memory import make_samples  # noqa: E402

SETTINGS = {"off": "0", "on": "1"}
FIELDS = ("wall", "user", "sys", "faults", "peak_gb")


def child(threads: int) -> None:
    """One process: load, an update on one sample, then the timed update."""
    import torch

    from rlhfless.config import load_config
    from rlhfless.devices import resolve_device
    from rlhfless.models import load_model, load_tokenizer
    from rlhfless.runtime.executor import build_learner

    torch.set_num_threads(threads)
    cfg = resolve_device(load_config(preset="default"))
    tokenizer = load_tokenizer(cfg.model)
    model = load_model(cfg.model, len(tokenizer), cfg.seed)
    samples = make_samples(4, cfg.algorithm.group_size, 128, cfg.generation.max_new_tokens, len(tokenizer))
    advantages = [torch.randn(len(s.response_ids)) for s in samples]
    learner = build_learner(cfg, model, tokenizer.pad_token_id)
    learner.learn(samples[:1], advantages[:1], None)
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    learner.learn(samples, advantages, None)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    row = {
        "wall": wall,
        "user": after.ru_utime - before.ru_utime,
        "sys": after.ru_stime - before.ru_stime,
        "faults": after.ru_minflt - before.ru_minflt,
        "peak_gb": after.ru_maxrss / 2**20,  # kB on Linux
    }
    print(json.dumps(row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.threads)
        return
    load_before = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    for r in range(args.repeats):
        for name, value in SETTINGS.items():
            command = [sys.executable, __file__, "--child", "--threads", str(args.threads)]
            env = {**os.environ, "THP_MEM_ALLOC_ENABLE": value}
            out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
            row = json.loads(out.strip().splitlines()[-1])
            runs[name].append(row)
            print(
                f"repeat {r + 1}, huge pages {name}: {row['wall']:.2f} s wall, {row['user']:.2f} s user, "
                f"{row['sys']:.2f} s system, {row['faults']} minor faults, peak {row['peak_gb']:.2f} GB",
                flush=True,
            )
    mean = {n: {k: statistics.mean(x[k] for x in v) for k in FIELDS} for n, v in runs.items()}
    on, off = mean["on"], mean["off"]
    print(f"means over {args.repeats} processes each       off        on   on/off")
    for key in FIELDS:
        print(f"  {key:38s} {off[key]:9.2f} {on[key]:9.2f} {on[key] / off[key]:8.3f}")
    print(f"load average (1 min) before {load_before:.1f}, after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
