"""Does the speed probe read the learning phase's speed? Side by side in one process, round by round.

The whole-run forecast scales the cached learning rate (and the run memory's learned seconds) by
the speed probe, which times decode steps on one thread (`runtime.machine.probe`). Each round
times that probe and then the learning rate afresh on the default model, as
`run_forecast.learning_seconds_per_token` times it before a run (a synthetic batch of 8 samples,
the driver's threads), with `--hog` CPU-bound processes beside both in every other round (0: every
round quiet, which shows the two readings' own noise). The first `--warm` timings are left out:
each copy of the model first touches fresh memory, which is slow on these machines.

    .venv/bin/python benchmarks/probe_vs_learning.py [--rounds 8] [--hog 2] [--warm 3]

Prints each round's probe (its three decode steps, ms) and learning rate (ms a token), then, per
kind of round, each measure's median over the first quiet round's.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

from rlhfless.config import load_config
from rlhfless.devices import resolve_device
from rlhfless.runtime.machine import Speed, probe
from rlhfless.runtime.run_forecast import learning_seconds_per_token
from rlhfless.runtime.run_inputs import load_inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--hog", type=int, default=2, help="CPU-bound processes in every other round")
    parser.add_argument("--warm", type=int, default=3, help="learning timings left out first")
    args = parser.parse_args()

    cfg = resolve_device(load_config(preset="default", overrides=("runtime.executor=ray",)))
    tokenizer, prompts, _, model = load_inputs(cfg)
    prompt_ids = tokenizer(prompts[0].messages[-1]["content"])["input_ids"][:100]

    def learning_rate() -> float:
        with tempfile.TemporaryDirectory() as cache:  # timed afresh, never read from a cache
            return learning_seconds_per_token(
                model, replace(cfg, model=replace(cfg.model, cache_dir=cache)), prompt_ids
            )

    for _ in range(args.warm):
        learning_rate()
    rows = []
    for r in range(args.rounds):
        hogged = bool(args.hog) and r % 2 == 1
        hogs = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.hog if hogged else 0)
        ]
        try:
            if hogs:
                time.sleep(1.0)  # let them take the cores first
            probe_ms = probe(model, cfg.runtime.threads_per_actor, cfg.generation.packed_weights)
            rate = learning_rate()
        finally:
            for hog in hogs:
                hog.kill()
        rows.append((hogged, probe_ms, rate))
        print(
            f"round {r} {'hog  ' if hogged else 'quiet'}: probe {[round(ms, 1) for ms in probe_ms]} ms, learning {1000 * rate:.2f} ms a token",
            flush=True,
        )

    _, base_probe, base_rate = rows[0]
    for kind in (False, True):
        mine = [(Speed(base_probe, p).factor, rate / base_rate) for hogged, p, rate in rows if hogged == kind]
        if mine:
            probe_x, learn_x = (statistics.median(x) for x in zip(*mine, strict=True))
            print(
                f"{'hog' if kind else 'quiet'} rounds: probe x{probe_x:.2f}, learning x{learn_x:.2f} the first round's"
            )


if __name__ == "__main__":
    main()
