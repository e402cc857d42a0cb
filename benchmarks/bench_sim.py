"""Simulator speed: paper-sim (20 x 8 H100, Llama-2-70B TP8), 8,192 prompts x 4 samples per step.

Goal: 100 steps in under 30 s. Prints wall time per policy and where a step's time goes
(planner vs simulation vs predictor update).
Run: .venv/bin/python benchmarks/bench_sim.py [steps]
"""

from __future__ import annotations

import os
import sys
import time

from rlhfless.planner.predictor import LengthPredictor
from rlhfless.sim.config import build
from rlhfless.sim.presets import preset
from rlhfless.sim.runner import VARIANTS, make_stage, make_workload, scheduler_for
from rlhfless.sim.step import Simulator


def main(steps: int) -> None:
    _, tree = preset("paper-sim")[0]
    cfg = build(tree)
    stage = make_stage(cfg)
    total = 0.0
    for name in ("verl", "rlhfless"):
        workload = make_workload(cfg)
        config = scheduler_for(cfg, VARIANTS[name])
        sim = Simulator(stage, config, LengthPredictor.from_config(config))
        parts = {"workload": 0.0, "plan": 0.0, "execute": 0.0, "predictor update": 0.0}
        start = time.perf_counter()
        for k in range(steps):
            t0 = time.perf_counter()
            prompts = workload.step(k)
            t1 = time.perf_counter()
            plan = sim.plan(prompts)
            t2 = time.perf_counter()
            sim.execute(k, prompts, plan)
            t3 = time.perf_counter()
            sim.predictor.update_many(prompts.uids, prompts.lengths)
            t4 = time.perf_counter()
            for key, dt in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                parts[key] += dt
        wall = time.perf_counter() - start
        total += wall
        split = ", ".join(f"{k} {v:.1f}s" for k, v in parts.items())
        print(f"{name:9s} {steps} steps: {wall:6.1f} s = {wall / (30.0 * steps / 100):.2f} x goal  ({split})")
    goal = 30.0 * steps / 100
    print(f"both policies: {total:.1f} s; goal {goal:.0f} s per policy for {steps} steps")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (timings scale with contention)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
