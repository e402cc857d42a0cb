"""A speed probe that read the machine slow: its run's forecasts, and the next run's.

Default runs in a row share one run memory (`runtime.calibration_memory`), in a cache of this
benchmark's own (the time tables and the converted model are taken from the user's cache; no run
memory): `--quiet` quiet runs that write the memory, a run whose start has `--hog` CPU-bound
processes beside it until its forecast is written (so its speed probe reads the machine slow, as
one did in session 57's `bench_runtime.py`), and a quiet run after it. For each: the
probe's speed factor, the whole-run forecast before step 1 against the run, and the per-step
forecasts of generation and step time after the first step (error = forecast / actual - 1).

Side by side, against the last run: whole-run forecasts (`rlhfless plan --run`, one after the
other just before it) from the memory as the wrongly probed run left it, and from the same memory
as the rule before `run_memory` kept it (that run's probe and its own decode scale).

    .venv/bin/python benchmarks/bench_noisy_probe.py [--steps 4] [--quiet 2] [--hog 2] [--out /tmp/bench_noisy]
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

USER_CACHE = Path(os.environ.get("RLHFLESS_CACHE", "~/.cache/rlhfless")).expanduser()


def own_cache(out: Path) -> Path:
    """The user's time tables and converted model, without any run memory."""
    cache = out / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    (cache / "profiles").mkdir(parents=True)
    if not USER_CACHE.is_dir():  # a fresh machine: the first run converts and measures
        return cache
    for entry in USER_CACHE.iterdir():
        if entry.name != "profiles":
            (cache / entry.name).symlink_to(entry.resolve())
    for table in (USER_CACHE / "profiles").glob("*.json"):
        if not table.name.startswith("calibration-"):
            shutil.copy(table, cache / "profiles" / table.name)
    return cache


def rlhfless(*args: str, env: dict[str, str], hog: int = 0, until: Path | None = None) -> str:
    """`rlhfless ARGS` in a process of its own, with `hog` CPU-bound processes beside it until
    `until` exists; its stdout."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hog)]
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlhfless", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        while hogs and proc.poll() is None and not (until and until.is_file()):
            time.sleep(0.2)
    finally:
        for h in hogs:
            h.kill()
    out, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"rlhfless {' '.join(args)} failed ({proc.returncode}): {err[-2000:]}")
    return out


def as_before(memory: dict) -> dict:
    """`memory` as the rule before `run_memory` kept it: the last run's probe and decode scale."""
    scale, usual = memory["scales"][-1], memory["calibration"]["decode_scale"]
    return {
        **memory,
        "calibration": {**memory["calibration"], "decode_scale": scale},
        "probe_ms": [ms * usual / scale for ms in memory["probe_ms"]],
    }


def errors(rows: list[dict], key: str) -> str:
    """Steps 2.. of `forecast/error/<key>`, as percentages."""
    return " ".join(f"{r[f'forecast/error/{key}']:+.0%}" for r in rows[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--quiet", type=int, default=2, help="quiet runs before the wrongly probed one")
    parser.add_argument("--hog", type=int, default=2, help="CPU-bound processes beside its start")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_noisy"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cache = own_cache(args.out)
    env = {**os.environ, "RLHFLESS_CACHE": str(cache)}
    common = ("--preset", "default", f"trainer.steps={args.steps}")
    runs = [(f"quiet {i + 1}", 0) for i in range(args.quiet)]
    runs += [(f"{args.hog} hogs at its start", args.hog), ("quiet after it", 0)]
    print(f"{'run':22s} {'speed':>6s} {'whole run: time':>16s} {'cost':>7s}  per step after the first")
    for name, hog in runs:
        run = args.out / name.replace(" ", "_")
        shutil.rmtree(run, ignore_errors=True)
        if name == "quiet after it":
            [path] = (cache / "profiles").glob("calibration-*.json")
            kept = json.loads(path.read_text())
            path.write_text(json.dumps(as_before(kept)))
            before = json.loads(rlhfless("plan", "--run", *common, "--json", env=env))
            path.write_text(json.dumps(kept))
            now = json.loads(rlhfless("plan", "--run", *common, "--json", env=env))
        rlhfless(
            "train",
            *common,
            f"output_dir={run}",
            "trainer.progress=false",
            env=env,
            hog=hog,
            until=run / "forecast.json",
        )
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
        f = json.loads((run / "forecast.json").read_text())
        t, c = sum(r["time/step"] for r in rows), sum(r["cost/step"] for r in rows)
        scales = " ".join(f"{r['calibration/decode_scale']:.2f}" for r in rows)
        print(
            f"{name:22s} x{f['machine/speed']:5.2f} {f['time_s'] / t - 1:+16.1%} {f['cost'] / c - 1:+7.1%}  "
            f"generation time {errors(rows, 'generation_time')}; step time {errors(rows, 'step_time')}; "
            f"decode scale {scales}"
        )
    print(f"the last run against forecasts made just before it: {t:.1f} s, ${c:.4g}")
    for label, forecast in (("memory as kept", now), ("memory as the rule before kept it", before)):
        print(
            f"  {label:34s} x{forecast['machine/speed']:.2f}: time {forecast['time_s'] / t - 1:+.1%}, "
            f"cost {forecast['cost'] / c - 1:+.1%}"
        )


if __name__ == "__main__":
    main()
