"""How much of generation's gap to its floor a better length predictor could close (simulated).

rlhfless runs each scenario three times on the same workload, from a fresh predictor, with three
predictors: `ewma` (what runs: each prompt's last observations), `expected` (told each prompt's
expected group max and mean for the step: its length distribution, not its samples, so the best
any predictor does that cannot foresee sampling) and `oracle` (told the samples' true lengths).
Per scenario and predictor it prints generation time over the floor and the plan's forecast error
(forecast generation over executed). What `expected` leaves above `oracle` is the samples' own
noise, which no prediction removes; what `ewma` leaves above `expected` is the predictor's.

    .venv/bin/python benchmarks/predictor_ceiling.py [--steps 10] [--only gsm8k] [--floor-scenarios]

`--floor-scenarios` adds `bench_floor.py`'s clusters, models and length shapes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from rlhfless.sim import experiments
from rlhfless.sim.config import build
from rlhfless.sim.presets import preset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_floor import SCENARIOS, scenario_tree  # noqa: E402

PREDICTORS = {"rlhfless": "ewma", "expected": "expected", "oracle": "oracle"}  # variant: predictor


def scenarios(steps: int, floor_scenarios: bool) -> list[tuple[str, dict[str, Any]]]:
    out = [
        (name, {**tree, "training": {**tree["training"], "steps": steps}})
        for name, tree in preset("paper-sim")
    ]
    if floor_scenarios:
        out += [(name, scenario_tree(spec, steps)) for name, spec in SCENARIOS.items()]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--only", default="", help="run the scenarios whose name holds this")
    parser.add_argument("--floor-scenarios", action="store_true", help="add bench_floor.py's scenarios")
    args = parser.parse_args()
    print(
        f"{'scenario (simulated)':28s}"
        + "".join(f" {p + '/fl':>12s} {'fcst':>6s}" for p in PREDICTORS.values())
    )
    gaps = []
    for name, tree in scenarios(args.steps, args.floor_scenarios):
        if args.only and args.only not in name:
            continue
        t0 = time.perf_counter()
        results = experiments.compare(build(tree), tuple(PREDICTORS), args.steps)
        over, cells = {}, []
        for variant, steps in results.items():
            gen = np.array([r.generation for r in steps])
            over[variant] = gen.sum() / sum(r.floor_time for r in steps)
            forecast = np.array([r.predicted_time for r in steps]) / gen - 1.0
            cells.append(f" {over[variant]:11.3f}x {100 * forecast.mean():+5.1f}%")
        gaps.append(over)
        print(f"{name:28s}{''.join(cells)} {time.perf_counter() - t0:5.0f} s", flush=True)
    for variant, predictor in PREDICTORS.items():
        values = np.array([g[variant] for g in gaps])
        if values.size:
            print(
                f"{predictor:>9s}: over floor {values.min():.3f}-{values.max():.3f}x, <= 1.25x in "
                f"{int((values <= 1.25).sum())}/{values.size}"
            )
    print(f"(simulated; {args.steps} steps each; load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
