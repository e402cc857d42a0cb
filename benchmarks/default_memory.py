"""Peak resident memory of every process of the default run: `rlhfless train --preset default`
on its Ray executor (the learner on two ranks), sampled by `memory_sampler.py`, against the 4 GB
goal of every process (driver and each Ray function).

    .venv/bin/python benchmarks/default_memory.py [--steps 2] [--json out.json] [key=value ...]

Prints the per-kind peaks (by phase), the goal's verdict, the load average before and after (the
machine may be shared), and for each Ray function its peak moment: which method it was running
(Ray titles the process `ray::LearnerRank.learn`). `--json` writes the peaks and every sample.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_trl import MEMORY_GOAL_GB, run_rlhfless  # noqa: E402
from memory_sampler import GB, MemorySampler, memory_table  # noqa: E402


def peak_moments(series: list[tuple], kinds: list[str]) -> list[str]:
    """Per kind, the sample of its largest RSS: when, in which phase, in which method."""
    lines = []
    for kind in kinds:
        rows = [r for r in series if r[2] == kind or r[2].startswith(f"ray::{kind}")]
        if rows:
            t, phase, title, pid, rss, private = max(rows, key=lambda r: r[4])
            lines.append(
                f"  {kind:16s} {rss / GB:5.2f} GB (private {private / GB:.2f}) at {t:6.1f} s, "
                f"phase {phase}, {title} (pid {pid})"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--period", type=float, default=0.05, help="sampling period, seconds")
    parser.add_argument("--json", help="write the peaks and every sample here")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. trainer.micro_batch_tokens=256")
    args = parser.parse_args()
    scratch = tempfile.TemporaryDirectory(prefix="default_memory.")  # the run's files, gone at exit
    out = Path(scratch.name)
    load_before = os.getloadavg()
    start = time.perf_counter()
    with MemorySampler(args.period, series=True) as mem:
        result = run_rlhfless(args.steps, "default", tuple(args.overrides), out / "run", mem)
    wall = time.perf_counter() - start
    load_after = os.getloadavg()
    memory = mem.to_dict()
    print(memory_table(memory, f"rlhfless default, {args.steps} steps, {wall:.0f} s"))
    kinds = ["driver", *memory["ray_functions"]]
    print("peak moments:")
    print("\n".join(peak_moments(mem.series, kinds)))
    peaks = {k: memory["overall"][k]["rss"] / GB for k in kinds}
    over = {k: v for k, v in peaks.items() if v > MEMORY_GOAL_GB}
    verdict = "met" if not over else "NOT met: " + ", ".join(f"{k} {v:.2f} GB" for k, v in over.items())
    print(f"every process (driver, each Ray function) at most {MEMORY_GOAL_GB} GB RSS: {verdict}")
    print(f"load average (1 min) before {load_before[0]:.1f}, after {load_after[0]:.1f}")
    print("step times: " + ", ".join(f"{s['time']:.1f} s" for s in result["steps"]))
    if args.json:
        payload = {
            "steps": result["steps"],
            "memory": memory,
            "series": mem.series,
            "load": [load_before, load_after],
        }
        Path(args.json).write_text(json.dumps(payload))


if __name__ == "__main__":
    main()
