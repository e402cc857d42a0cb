"""The whole-run forecast with and without the speed probe, against one real run.

The time table, the learning rate and the length pilot are cached first in a cache of this
benchmark's own (`--hog K`: with K CPU-bound processes beside them, a slower hour), then the run's
forecast is made without the probe (`rlhfless plan --run ... runtime.speed_probe=false`), and the
run itself trains with it on (its `forecast.json`). Both are set against the run's measured total
time and cost. A host's speed drifts between the two forecasts too: read the probe's figures.

    .venv/bin/python benchmarks/bench_speed_probe.py --steps 8 [--hog 2] [--out /tmp/bench_probe]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

COMMON = ("runtime.calibration_memory=false",)


def ms(forecast: dict) -> str:
    """The probe's decode steps, as a forecast recorded them."""
    return ", ".join(f"{x:.1f}" for x in forecast["machine/probe_ms"])


def rlhfless(*args: str, env: dict[str, str]) -> str:
    """`rlhfless ARGS` in a process of its own; its stdout."""
    return subprocess.run(
        [sys.executable, "-m", "rlhfless", *args], env=env, check=True, capture_output=True, text=True
    ).stdout


def plan(out: Path, name: str, steps: int, env: dict[str, str], *extra: str) -> dict:
    """`rlhfless plan --run default` as JSON, kept as `out/name.json`."""
    text = rlhfless("plan", "--run", "default", f"trainer.steps={steps}", *COMMON, *extra, "--json", env=env)
    (out / f"{name}.json").write_text(text)
    return json.loads(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--hog", type=int, default=0, help="CPU-bound processes beside the caching")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_probe"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RLHFLESS_CACHE": str(args.out / "cache")}

    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hog)]
    try:
        cached = plan(args.out, "cached", args.steps, env)  # measures and caches what is missing
    finally:
        for h in hogs:
            h.kill()
    time.sleep(5)
    before = plan(args.out, "no_probe", args.steps, env, "runtime.speed_probe=false")
    run = args.out / "run"
    shutil.rmtree(run, ignore_errors=True)  # this benchmark's own run: a rerun replaces it
    rlhfless(
        "train",
        "--preset",
        "default",
        f"trainer.steps={args.steps}",
        *COMMON,
        f"output_dir={run}",
        "trainer.progress=false",
        env=env,
    )
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    actual_t, actual_c = sum(r["time/step"] for r in rows), sum(r["cost/step"] for r in rows)
    with_probe = json.loads((run / "forecast.json").read_text())
    print(f"cached with {args.hog} CPU-bound process(es) beside it: probe {ms(cached)} ms")
    print(f"run: {len(rows)} steps, {actual_t:.1f} s, ${actual_c:.4g} (measured)")
    for name, f in (("without the probe", before), ("with the probe (the run's)", with_probe)):
        print(
            f"  {name:28s} x{f['machine/speed']:.3f} (probe {ms(f)} ms): "
            f"time {f['time_s']:.1f} s ({f['time_s'] / actual_t - 1:+.1%}), "
            f"cost ${f['cost']:.4g} ({f['cost'] / actual_c - 1:+.1%})"
        )


if __name__ == "__main__":
    main()
