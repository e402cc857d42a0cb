"""What each step of a finished run paid for: billed unit-seconds by kind of function.

Reads the runs' `timeline/step_*.json` (e.g. both run directories of `bench_runtime.py --out DIR`).
A function billed on its own (cost > 0) counts its units from request to release (its start
included: `of it starting` says how much) and keep-alive functions their idle; a function
colocated with another costs nothing of its own (its host's allocation covers it) and is left
out. Prints, per step, each kind's unit-seconds and the step's total and cost; with several runs,
each later run's total and cost over the first's.

    .venv/bin/python benchmarks/step_bill.py DIR/verl DIR/rlhfless [--from-step 2]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def step_bills(run: Path) -> dict[int, dict]:
    """Per step: unit-seconds and starting seconds by kind, the total and the cost."""
    out = {}
    for path in sorted((run / "timeline").glob("step_*.json")):
        step = json.loads(path.read_text())
        held: dict[str, float] = defaultdict(float)
        starting: dict[str, float] = defaultdict(float)
        for f in step["functions"]:
            if f["cost"] <= 0:
                continue
            kind = "learner rank" if f["kind"] == "learner" and f["name"] != "learner" else f["kind"]
            held[kind] += f["units"] * (f["released"] - f["requested"])
            if f["cold"]:
                starting[kind] += f["units"] * (f["ready"] - f["requested"])
        total = sum(held.values())
        cost = sum(f["cost"] for f in step["functions"])
        out[step["step"]] = {"held": dict(held), "starting": dict(starting), "total": total, "cost": cost}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="finished run directories")
    parser.add_argument("--from-step", type=int, default=1)
    args = parser.parse_args()
    bills = {run: step_bills(run) for run in args.runs}
    first = bills[args.runs[0]]
    for run, steps in bills.items():
        for n, bill in steps.items():
            if n < args.from_step:
                continue
            kinds = ", ".join(
                f"{kind} {s:.1f}"
                + (f" ({bill['starting'][kind]:.1f} of it starting)" if bill["starting"].get(kind) else "")
                for kind, s in sorted(bill["held"].items())
            )
            versus = ""
            if run != args.runs[0] and n in first and first[n]["total"] > 0:
                versus = (
                    f"; {bill['total'] / first[n]['total']:.3f}x the unit-seconds and "
                    f"{bill['cost'] / first[n]['cost']:.3f}x the cost of {args.runs[0].name}"
                )
            print(
                f"{run.name} step {n}: {bill['total']:.1f} unit-seconds, ${bill['cost']:.6f} ({kinds}){versus}"
            )


if __name__ == "__main__":
    main()
