"""A budget or a deadline per step instead of lam: is it met, and does it change the plan?

`sim`: on a simulated scenario (a preset's first scenario, figures labelled simulated), runs the
default lam, reads each step's candidate plans, and sets a budget (then a deadline) between the
cheapest and the fastest plan's forecast step cost (time) on every step: halfway between the
dearest step's cheapest plan and the cheapest step's fastest plan. It runs again under each target
and prints the share of steps whose *simulated* cost
(time) met it, and the mean cost and time beside the lam run's.

`real`: the same on this machine's runtime. `--baseline RUN_DIR` is a finished default run (e.g.
the rlhfless run of `bench_runtime.py --out DIR`); its plans give the cheapest and fastest plans
per step (pairs of N and learning width, where the elastic learner's width is the target's to
choose), and one more run of as many steps trains under the midway deadline (or `--target
budget`; `--value` sets either).

    .venv/bin/python benchmarks/bench_targets.py sim --preset paper-sim
    .venv/bin/python benchmarks/bench_targets.py real --baseline /tmp/bench_rt/rlhfless --out /tmp/targets \
        [scheduler.target_miss=nearest]
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path

from rlhfless.config import load_config
from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.predictor import LengthPredictor
from rlhfless.sim.config import build
from rlhfless.sim.presets import preset
from rlhfless.sim.runner import make_stage, make_workload, scheduler_for
from rlhfless.sim.step import Simulator


def _midway(candidates: list[list[dict]], after: list[float], key: str) -> float:
    """A target inside every step's range: halfway between the dearest step's cheapest plan and the
    cheapest step's fastest plan (forecast step `key`); where no one value lies inside every
    step's range, halfway between the means (some steps then cannot meet it, and say so)."""
    low, high = [], []
    for rows, rest in zip(candidates, after, strict=True):
        cheapest = min(rows, key=lambda r: (r["cost"], r["time"]))
        fastest = min(rows, key=lambda r: (r["time"], r["cost"]))
        ends = sorted((cheapest[key] + rest, fastest[key] + rest))
        low.append(ends[0])
        high.append(ends[1])
    if max(low) < min(high):
        return 0.5 * (max(low) + min(high))
    print(f"no {key} target lies inside every step's range: halfway between the means")
    return 0.5 * (statistics.fmean(low) + statistics.fmean(high))


def _report(name: str, target: float, unit: str, rows: list[tuple[float, float]], base: tuple[float, float]):
    key = 1 if unit == "$" else 0
    met = sum(r[key] <= target * (1 + 1e-9) for r in rows)
    t, c = statistics.fmean(r[0] for r in rows), statistics.fmean(r[1] for r in rows)
    print(
        f"{name:9s} {target:12.6g} {unit}: met on {met}/{len(rows)} steps; mean step {t:8.2f} s "
        f"({t / base[0]:.2f}x lam's), cost {c:.6g} ({c / base[1]:.2f}x lam's)"
    )


def _simulate(cfg, overrides: dict, steps: int, stage, workload, extremes: list | None = None) -> list[tuple]:
    """(result, plan) per step of one policy from a fresh predictor, as `run_policy` runs them.
    `extremes`, where given, receives each step's fastest and cheapest plan there is (the plan
    under an unmeetable deadline, then budget, taking the nearest), at the run's predictor state:
    with decode sizes and their splits as plan dimensions, a plan's own candidates hold only its
    own size's N (a split's, only itself)."""
    config = scheduler_for(cfg, overrides)
    simulator = Simulator(stage, config, LengthPredictor.from_config(config))
    plans = []
    plan = simulator.plan

    def keep(*args):
        plans.append(plan(*args))
        if extremes is not None:
            row = []
            for key in ("deadline_per_step", "budget_per_step"):
                simulator.config = replace(config, **{key: 1e-12}, target_miss="nearest")
                other = plan(*args)
                row.append({"time": other.predicted_step_time, "cost": other.predicted_step_cost})
            simulator.config = config
            extremes.append(row)
        return plans[-1]

    simulator.plan = keep
    results = [simulator.run_step(k, workload.step(k)) for k in range(steps)]
    return list(zip(results, plans, strict=True))


def sim(args: argparse.Namespace) -> None:
    name, tree = preset(args.preset)[0]
    tree["training"]["steps"] = args.steps
    cfg = build(tree)
    stage, workload = make_stage(cfg), make_workload(cfg)
    extremes: list[list[dict]] = []
    lam = _simulate(cfg, {"policy": "rlhfless"}, args.steps, stage, workload, extremes)
    base = (statistics.fmean(r.time for r, _ in lam), statistics.fmean(r.cost for r, _ in lam))
    print(f"simulated: {name}, {args.steps} steps; lam: mean step {base[0]:.2f} s, cost {base[1]:.6g}")
    for k, (fastest, cheapest) in enumerate(extremes):
        print(
            f"  step {k}: fastest plan {fastest['time']:.2f} s {fastest['cost']:.6g} $, "
            f"cheapest {cheapest['time']:.2f} s {cheapest['cost']:.6g} $ (forecast)"
        )
    zeros = [0.0] * len(extremes)
    budget = _midway(extremes, zeros, "cost")
    deadline = _midway(extremes, zeros, "time")
    for label, key, value, unit in (
        ("budget", "budget_per_step", budget, "$"),
        ("deadline", "deadline_per_step", deadline, "s"),
    ):
        runs = _simulate(cfg, {"policy": "rlhfless", key: value}, args.steps, stage, workload)
        _report(label, value, unit, [(r.time, r.cost) for r, _ in runs], base)
        print(
            f"          decode actors per step {[p.n_actors for _, p in runs]} (lam: {[p.n_actors for _, p in lam]})"
        )


def real(args: argparse.Namespace) -> None:
    from rlhfless.runtime.trainer import train

    base_dir = args.baseline
    steps = sorted(int(p.stem.split("_")[1]) for p in (base_dir / "plans").glob("step_*.json"))
    metrics = {
        r["step"]: r for r in map(json.loads, (base_dir / "metrics.jsonl").read_text().split("\n")[:-1])
    }
    steps = [s for s in steps if s > 1]  # the first plan knew nothing of this machine yet
    plans = [json.loads((base_dir / "plans" / f"step_{s:06d}.json").read_text()) for s in steps]
    after_t = [p["predicted_step_time"] - p["predicted_time"] for p in plans]
    after_c = [p["predicted_step_cost"] - p["predicted_cost"] for p in plans]
    candidates = [p["candidates"] for p in plans]
    if all(p.get("step_options") for p in plans):  # the learning width is the target's choice too
        candidates = [
            [{"time": o["step_time"], "cost": o["step_cost"]} for o in p["step_options"]] for p in plans
        ]
        after_t = after_c = [0.0] * len(plans)
    if args.target == "budget":
        key, value = "budget_per_step", args.value or _midway(candidates, after_c, "cost")
    else:
        key, value = "deadline_per_step", args.value or _midway(candidates, after_t, "time")
    base_rows = [(metrics[s]["time/step"], metrics[s]["cost/step"]) for s in steps]
    base = (statistics.fmean(r[0] for r in base_rows), statistics.fmean(r[1] for r in base_rows))
    print(f"lam run {base_dir}: steps {steps[0]}-{steps[-1]}: mean step {base[0]:.2f} s, cost {base[1]:.6g}")
    cfg = load_config(
        base_dir / "config.yaml",
        overrides=(
            f"scheduler.{key}={value}",
            f"output_dir={args.out}",
            "trainer.progress=false",
            f"scheduler.length_pilot={args.pilot}",
            *((f"trainer.steps={args.steps}",) if args.steps else ()),
            *args.overrides,
        ),
    )

    def say(kind: str, info: dict) -> None:  # the run forecast's warning, and each step's
        if "warning" in info or kind == "warning":
            print(f"warning: {info.get('warning') or info['message']}")

    result = train(cfg, say)
    missed = [h["step"] for h in result.history if h.get("target/missed")]
    if missed:
        print(f"steps that took the nearest plan (scheduler.target_miss=nearest): {missed}")
    rows = [(h["time/step"], h["cost/step"]) for h in result.history if h["step"] > 1]
    n = [h["plan/n_actors"] for h in result.history]
    print(
        f"{key}: decode actors per step {n} (lam run: {[metrics[s]['plan/n_actors'] for s in [1, *steps]]})"
    )
    widths = [int(h.get("learner/width", 1)) for h in result.history]
    print(
        f"{key}: learning width per step {widths} (lam run: {[int(metrics[s].get('learner/width', 1)) for s in [1, *steps]]})"
    )
    _report(key.split("_")[0], value, "$" if key.startswith("budget") else "s", rows, base)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("sim")
    s.add_argument("--preset", default="paper-sim")
    s.add_argument("--steps", type=int, default=10)
    r = sub.add_parser("real")
    r.add_argument("--baseline", type=Path, required=True, help="a finished run directory (lam)")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--target", choices=("deadline", "budget"), default="deadline")
    r.add_argument("--value", type=float, help="the target (s or USD per step; default: midway)")
    r.add_argument("--steps", type=int, help="steps of the targeted run (default: the baseline's)")
    r.add_argument(
        "--pilot",
        type=int,
        default=SchedulerConfig().length_pilot,
        help="the targeted run's scheduler.length_pilot (a baseline may predate its default; without "
        "one, step 1 plans on default_length and refuses a deadline the run would meet)",
    )
    r.add_argument("overrides", nargs="*", help="more key=value overrides of the targeted run")
    args = parser.parse_args()
    sim(args) if args.mode == "sim" else real(args)


if __name__ == "__main__":
    main()
