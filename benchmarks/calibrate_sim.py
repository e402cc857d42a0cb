"""Calibration: the simulator's generation time against real runtime steps on this machine.

Replays a real run in the simulator: its recorded plans (`plans/step_*.json`) and response lengths
(`rollouts/step_*.jsonl`) on a model of this machine (one node of the run's actor slots) timed by
the profile the run planned with (`runtime.profile`, measured by `rlhfless profile`). Prints the
simulated and the measured generation seconds of every step and their ratio (goal: within 20%).

    .venv/bin/rlhfless profile --output /tmp/cpu_profile.json
    .venv/bin/rlhfless train --preset default trainer.steps=5 runtime.profile=/tmp/cpu_profile.json \\
        output_dir=/tmp/calib
    .venv/bin/python benchmarks/calibrate_sim.py /tmp/calib [more run directories]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from dataclasses import asdict
from pathlib import Path

from rlhfless.config import load_config
from rlhfless.planner.plan import StepPlan
from rlhfless.planner.predictor import LengthPredictor
from rlhfless.runtime.planning import CPU_SLOT
from rlhfless.sim.config import build
from rlhfless.sim.runner import make_stage, scheduler_for
from rlhfless.sim.step import Simulator
from rlhfless.sim.workload import TraceWorkload

GOAL = 0.20


def replay(run_dir: Path, spec_file: Path) -> list[tuple[int, float, float]]:
    """(step, simulated, measured) generation seconds for every recorded step of one run."""
    cfg = load_config(run_dir / "config.yaml")
    if not cfg.runtime.profile:
        raise SystemExit(
            f"{run_dir}: runtime.profile is unset; calibrate a run planned with a measured profile"
        )
    measured = {}
    for line in (run_dir / "metrics.jsonl").read_text().split("\n"):
        if not line:
            continue
        row = json.loads(line)
        measured[row["step"]] = row["time/generation"]
    sim_cfg = build(
        {
            "cluster": {
                "nodes": 1,
                "gpus_per_node": cfg.runtime.slots(),
                "gpu": str(spec_file),
                "cold_start_s": 0,
            },
            "model": {"name": "smollm2-135m", "tp": 1, "profile": cfg.runtime.profile},
            "training": {"algorithm": cfg.algorithm.name if cfg.algorithm.name == "ppo" else "grpo"},
            "scheduler": asdict(cfg.scheduler),
        }
    )
    stage = make_stage(sim_cfg)
    scheduler = scheduler_for(sim_cfg, {})
    sim = Simulator(stage, scheduler, LengthPredictor.from_config(scheduler))
    trace = TraceWorkload(run_dir)
    rows = []
    for k, plan_file in enumerate(sorted((run_dir / "plans").glob("step_*.json"))):
        step = int(plan_file.stem.split("_")[1])
        plan = StepPlan.from_dict(json.loads(plan_file.read_text()))
        result = sim.execute(step, trace.step(k), plan)
        rows.append((step, result.generation, measured[step]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories of real runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spec_file = Path(tmp) / "cpu-slot.json"
        spec_file.write_text(json.dumps(asdict(CPU_SLOT)))
        print(f"{'run':28s} {'step':>4s} {'simulated s':>12s} {'measured s':>11s} {'sim/real':>9s}")
        errors = []
        for run in args.runs:
            for step, sim_s, real_s in replay(run, spec_file):
                errors.append(abs(sim_s / real_s - 1.0))
                print(f"{run.name:28s} {step:4d} {sim_s:12.2f} {real_s:11.2f} {sim_s / real_s:9.2f}")
    within = sum(e <= GOAL for e in errors)
    print(
        f"mean |error| {100 * statistics.mean(errors):.1f}%, max {100 * max(errors):.1f}%; "
        f"{within}/{len(errors)} steps within {100 * GOAL:.0f}% (simulated vs measured generation)"
    )


if __name__ == "__main__":
    main()
