"""Calibration: the simulator's generation time and cost against real runtime steps on this machine.

Replays a real run in the simulator: its recorded plans (`plans/step_*.json`) and response lengths
(`rollouts/step_*.jsonl`) on a model of this machine (one node of the run's actor slots) timed by
the profile the run planned with (its `runtime.profile`, or the measured table cached under
`model.cache_dir/profiles/` for its model, dtype and a decode function's threads, found by the
runtime's own lookup), corrected as the run's own planner had corrected it
for that step (`calibration/*` of the step before: the same time model). The simulated functions are priced by the one
pricing model as the runtime bills them (the learner's slot held for the whole generation, every
other decode function from its request to its release; cold starts are left out, as this
machine's profile holds none). The simulator's functions take their weights with their slots
(`Billing.handoff`), where the runtime's stream them from the learner: about 0.2 s a step here. Prints, per step, the simulated and the
measured generation seconds and cost, and beside them the plan's own forecast error, so that the
simulator and the runtime's forecast are judged by the same figures (goal: within 20%).

    .venv/bin/rlhfless train --preset default trainer.steps=5 output_dir=/tmp/calib
    .venv/bin/python benchmarks/calibrate_sim.py /tmp/calib [more run directories]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

from rlhfless.config import load_config
from rlhfless.models import load_model, load_tokenizer
from rlhfless.planner.forecast import Calibration
from rlhfless.planner.predictor import LengthPredictor
from rlhfless.planner.pricing import charge
from rlhfless.planner.step_plan import StepPlan
from rlhfless.runtime.machine import CPU_SLOT, at_speed, cache_key, machine_profile
from rlhfless.sim.config import build
from rlhfless.sim.runner import make_stage, scheduler_for
from rlhfless.sim.step import Simulator
from rlhfless.sim.workload import TraceWorkload

GOAL = 0.20


def _profile(cfg, run_dir: Path, folder: Path) -> str:
    """The time table the run planned with, found as the run found it (`machine_profile`: its own
    file, else the measured table cached for its model, dtype and a decode function's threads,
    scaled by the machine's speed the run probed, `machine/speed` in its forecast), as a file for
    the simulator's config."""
    model = load_model(cfg.model, len(load_tokenizer(cfg.model)), cfg.seed)
    path = folder / f"profile-{cache_key(model, cfg.runtime.threads_per_actor)}.json"
    cached, _ = machine_profile(replace(cfg, runtime=replace(cfg.runtime, speed_probe=False)), model)
    forecast = run_dir / "forecast.json"
    speed = json.loads(forecast.read_text()).get("machine/speed", 1.0) if forecast.is_file() else 1.0
    path.write_text(json.dumps(at_speed(cached, speed).to_dict()))
    return str(path)


def replay(run_dir: Path, spec_file: Path) -> list[dict[str, float]]:
    """Per recorded step: simulated, measured and forecast generation seconds and cost."""
    cfg = load_config(run_dir / "config.yaml")
    measured = {}
    for line in (run_dir / "metrics.jsonl").read_text().split("\n"):
        if line:
            row = json.loads(line)
            measured[row["step"]] = row
    sim_cfg = build(
        {
            "cluster": {
                "nodes": 1,
                "gpus_per_node": cfg.runtime.slots(),
                "gpu": str(spec_file),
                "cold_start_s": 0,
                "price_per_gpu_hour": cfg.scheduler.price_per_gpu_hour,
            },
            "model": {"name": "smollm2-135m", "tp": 1, "profile": _profile(cfg, run_dir, spec_file.parent)},
            "training": {"algorithm": cfg.algorithm.name if cfg.algorithm.name == "ppo" else "grpo"},
            "scheduler": asdict(cfg.scheduler),
        }
    )
    base = make_stage(sim_cfg)
    scheduler = scheduler_for(sim_cfg, {})
    trace = TraceWorkload(run_dir)
    serverful = cfg.scheduler.policy == "verl"
    rows = []
    for k, plan_file in enumerate(sorted((run_dir / "plans").glob("step_*.json"))):
        step = int(plan_file.stem.split("_")[1])
        plan = StepPlan.from_dict(json.loads(plan_file.read_text()))
        # The time model the run had learned when it planned this step (the step before's).
        before = measured.get(step - 1, {})
        cal = Calibration(before.get("calibration/decode_scale"), before.get("calibration/overhead_s"))
        stage = replace(base, profile=cal.profile(base.profile))
        sim = Simulator(stage, scheduler, LengthPredictor.from_config(scheduler))
        result = sim.execute(step, trace.step(k), plan)
        end = result.generation + (cal.overhead_s or 0.0)
        own = [a for a in result.actors if serverful or not a["colocated"]]
        # The learner's slot is the colocated actor's: verl's held allocation counts it once.
        cost = (0.0 if serverful else charge(stage.pricing, 1.0, end)) + sum(
            charge(stage.pricing, a["gpus"], end if serverful else a["released"]) for a in own
        )
        real = measured[step]
        rows.append(
            {
                "step": step,
                "sim_s": end,
                "real_s": real["time/generation"],
                "sim_cost": cost,
                "real_cost": real.get("cost/generation", float("nan")),
                "forecast_s": real.get("forecast/error/generation_time", float("nan")),
                "forecast_cost": real.get("forecast/error/generation_cost", float("nan")),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories of real runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spec_file = Path(tmp) / "cpu-slot.json"
        spec_file.write_text(json.dumps(asdict(CPU_SLOT)))
        head = (
            "run",
            "step",
            "sim s",
            "real s",
            "sim/real",
            "sim $",
            "real $",
            "sim/real",
            "plan err s",
            "plan err $",
        )
        print(f"{head[0]:20s} {head[1]:>4s} " + " ".join(f"{h:>10s}" for h in head[2:]))
        errors: dict[str, list[float]] = {"time": [], "cost": [], "forecast time": [], "forecast cost": []}
        for run in args.runs:
            for r in replay(run, spec_file):
                t, c = r["sim_s"] / r["real_s"], r["sim_cost"] / r["real_cost"]
                errors["time"].append(abs(t - 1))
                errors["cost"].append(abs(c - 1))
                if r["step"] > 1:  # the forecast's first step has learned nothing yet
                    errors["forecast time"].append(abs(r["forecast_s"]))
                    errors["forecast cost"].append(abs(r["forecast_cost"]))
                cells = (
                    r["sim_s"],
                    r["real_s"],
                    t,
                    r["sim_cost"],
                    r["real_cost"],
                    c,
                    r["forecast_s"],
                    r["forecast_cost"],
                )
                print(f"{run.name:20s} {r['step']:4d} " + " ".join(f"{x:10.4g}" for x in cells))
    for name, errs in errors.items():
        errs = [e for e in errs if e == e]  # runs recorded before the forecast metrics have none
        if errs:
            within = sum(e <= GOAL for e in errs)
            print(
                f"{name:14s}: mean |error| {100 * statistics.mean(errs):.1f}%, max {100 * max(errs):.1f}%; "
                f"{within}/{len(errs)} steps within {100 * GOAL:.0f}%"
                + (
                    " (simulated vs measured)"
                    if not name.startswith("forecast")
                    else " (steps after the first)"
                )
            )


if __name__ == "__main__":
    main()
