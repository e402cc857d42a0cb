"""Learning ahead off and on, interleaved, on the Ray runtime: what it does to a step's time and cost.

Trains rlhfless with `scheduler.learn_ahead` false, true, false, true, ... (`--rounds` pairs), each
run `--steps` steps of the same config on one embedded Ray, and prints per run the mean step time
and cost after its first step and the groups learned ahead, then off/on means and their ratios.
Interleaving keeps the machine's drift out of the ratio (in session 12 verl's step time moved by
up to 19% between runs an hour apart).

    .venv/bin/python benchmarks/bench_learn_ahead.py --steps 3 --rounds 2
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

import ray

from rlhfless.config import load_config
from rlhfless.runtime.ray_cluster import start_ray
from rlhfless.runtime.trainer import train


def run(on: bool, steps: int, preset: str, extra: tuple[str, ...], out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)  # this benchmark's own run: a rerun into --out replaces it
    cfg = load_config(
        preset=preset,
        overrides=(
            "runtime.executor=ray",
            "scheduler.policy=rlhfless",
            f"scheduler.learn_ahead={str(on).lower()}",
            f"trainer.steps={steps}",
            f"output_dir={out}",
            "trainer.save_every=0",
            "trainer.report=false",
            "trainer.progress=false",
            *extra,
        ),
    )
    later = train(cfg).history[1:]  # the first step starts every function cold
    return {
        "on": on,
        "time": statistics.fmean(h["time/step"] for h in later),
        "cost": statistics.fmean(h["cost/step"] for h in later),
        "steps": [round(h["time/step"], 1) for h in later],
        "ahead": [int(h.get("learn/ahead_groups", 0)) for h in later],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="off/on pairs")
    parser.add_argument("--preset", default="default")
    parser.add_argument("overrides", nargs="*", help="extra key=value config overrides for every run")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error(f"--steps: got {args.steps}, expected >= 2 (the first step is left out)")
    start_ray(load_config(preset=args.preset, overrides=("runtime.executor=ray",)).runtime)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(2 * args.rounds):
            row = run(i % 2 == 1, args.steps, args.preset, tuple(args.overrides), Path(tmp) / f"run{i}")
            print(
                f"learn_ahead={row['on']!s:5}: step {row['time']:.1f} s, cost {row['cost']:.5f} "
                f"(steps {row['steps']}, groups ahead {row['ahead']})",
                flush=True,
            )
            rows.append(row)
    ray.shutdown()
    off = [r for r in rows if not r["on"]]
    on = [r for r in rows if r["on"]]
    for key in ("time", "cost"):
        a, b = statistics.fmean(r[key] for r in off), statistics.fmean(r[key] for r in on)
        print(f"{key}: off {a:.4g}, on {b:.4g}, on/off {b / a:.3f}")


if __name__ == "__main__":
    main()
