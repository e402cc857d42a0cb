"""When the learner's extra rank was ready against generation's end, per step of a finished run.

Reads a run directory's `timeline/step_*.json` (e.g. the rlhfless run of `bench_runtime.py --out
DIR`). For each step whose learning phase started an elastic rank (`learner-1`, not one resident on
a held function), prints when it was requested and ready, when generation ended and when the rank
first worked: ready early means its slot billed idle; ready late means learning waited for it.

    .venv/bin/python benchmarks/rank_timing.py /tmp/bench_rt/rlhfless
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def rank_rows(run: Path) -> list[dict[str, float]]:
    """Per step with an elastic rank 1: its timing, in seconds from the step's start."""
    rows = []
    for path in sorted((run / "timeline").glob("step_*.json")):
        step = json.loads(path.read_text())
        rank = next((f for f in step["functions"] if f["name"] == "learner-1"), None)
        if rank is None or rank.get("colocated_with") or not rank["busy"]:
            continue
        total = sum(f["cost"] for f in step["functions"])
        busy = rank["busy"][0][0]
        per_s = rank["cost"] / max(rank["released"] - rank["requested"], 1e-9)
        rows.append(
            {
                "step": step["step"],
                "requested": rank["requested"],
                "ready": rank["ready"],
                "generation_end": step["preparation"]["generation_end"],
                "busy": busy,
                "idle_s": busy - rank["ready"],
                "idle_share": per_s * (busy - rank["ready"]) / total,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a finished run directory")
    parser.add_argument(
        "--from-step", type=int, default=2, help="first step counted (1: no start measured yet)"
    )
    args = parser.parse_args()
    rows = [r for r in rank_rows(args.run) if r["step"] >= args.from_step]
    if not rows:
        raise SystemExit(f"{args.run}: no step from {args.from_step} with an elastic learner rank")
    for r in rows:
        early = r["generation_end"] - r["ready"]
        print(
            f"step {r['step']}: requested {r['requested']:.1f} s, ready {r['ready']:.1f} s, generation "
            f"ended {r['generation_end']:.1f} s ({early:+.1f} s early), first busy {r['busy']:.1f} s: "
            f"idle {r['idle_s']:.1f} s, {100 * r['idle_share']:.1f}% of the step's cost"
        )
    early = [r["generation_end"] - r["ready"] for r in rows]
    print(
        f"{len(rows)} steps: ready {statistics.fmean(early):.2f} s before generation ended "
        f"({min(early):+.1f} to {max(early):+.1f}); idle {statistics.fmean(r['idle_s'] for r in rows):.2f} s "
        f"a step, {100 * statistics.fmean(r['idle_share'] for r in rows):.1f}% of its cost"
    )


if __name__ == "__main__":
    main()
