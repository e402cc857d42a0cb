"""The planner's time model against the simulated executor, range by range (simulated).

For each scenario of `bench_floor.py` and the paper-sim presets, one step's true group max and mean
are the predictions (the model's own representation: each prompt one sequence of its group max and
G - 1 alike ones keeping the group mean), and random contiguous ranges of the sorted order and of the planner's default order (backfill), from
0.3 to 3 times an actor's slots, are timed twice: by `planner.timemodel.RangeModel` and by
`sim.execution.schedule` (continuous batching, event by event, longest first). It prints the
model's decode-time error against the executor per scenario. Run it at two commits to compare
time models (a `git worktree` of the older one, `PYTHONPATH=src`).

    .venv/bin/python benchmarks/timemodel_accuracy.py [--ranges 40] [--seed 0]
"""

from __future__ import annotations

import argparse

import numpy as np
from bench_floor import SCENARIOS, scenario_tree

from rlhfless.planner.assignment import backfill_order, sorted_order
from rlhfless.planner.balance import backfill_threshold
from rlhfless.planner.timemodel import RangeModel, Workload
from rlhfless.sim.config import SimConfig, build
from rlhfless.sim.execution import schedule, slot_cap
from rlhfless.sim.presets import preset
from rlhfless.sim.runner import make_stage, make_workload


def errors(cfg: SimConfig, ranges: int, rng: np.random.Generator, backfill: bool) -> np.ndarray:
    """Model time over executor time, less 1, for `ranges` random ranges of one step, of the
    sorted order or (`backfill`) of the order the planner assigns by default, its prompts short
    enough to run in waves spread (`planner.balance`, for as many actors as the cluster holds)."""
    stage = make_stage(cfg)
    profile = stage.profile
    step = make_workload(cfg).step(1)
    g = step.lengths.shape[1]
    gmax, gmean = step.lengths.max(1).astype(float), step.lengths.mean(1)
    prompt = step.prompt_lengths.astype(float)
    workload = Workload(gmax, gmean, prompt, prompt * 0, prompt * 0, g)
    order = sorted_order(gmax, gmean)
    model = RangeModel(workload, order, profile, 16)
    if backfill:
        actors = stage.cluster.max_actors(profile.gpus)
        order = backfill_order(
            order, gmax, backfill_threshold(workload, model.prompt_segments, actors, 1, profile)
        )
        model = model.reordered(order)
    rest = workload.rest_length
    slots = float(profile.concurrency(prompt.mean() + gmean.mean()))
    out = []
    for _ in range(ranges):
        size = int(np.clip(rng.uniform(0.3, 3.0) * slots / g, 1, order.size))
        start = int(rng.integers(0, order.size - size + 1))
        group = order[start : start + size]
        lengths = np.concatenate([gmax[group], np.repeat(rest[group], g - 1)])
        context = np.concatenate([prompt[group], np.repeat(prompt[group], g - 1)])
        first = np.argsort(-lengths, kind="stable")
        cap = slot_cap(profile, context, lengths)
        ids = np.arange(lengths.size)
        exact = schedule(profile, 0.0, ids, context[first], lengths[first], cap).end_time
        modelled = float(model.times(np.array([start]), np.array([start + size]))["decode"][0])
        out.append(modelled / exact - 1)
    return np.array(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranges", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    cases = {name: build(scenario_tree(spec, 2)) for name, spec in SCENARIOS.items()}
    paper = dict(preset("paper-sim"))
    cases |= {f"paper-sim {d}": build(paper[f"grpo-llama-2-70b-{d}"]) for d in ("gsm8k", "gpqa", "lcb")}
    print(f"{'scenario (simulated)':28s} {'order':9s} {'mean':>7s} {'mean |e|':>9s} {'max |e|':>8s}")
    every: dict[str, list[np.ndarray]] = {"sorted": [], "backfill": []}
    for name, cfg in cases.items():
        for kind, errs in every.items():
            e = errors(cfg, args.ranges, rng, kind == "backfill")
            errs.append(e)
            print(
                f"{name:28s} {kind:9s} {100 * e.mean():+6.1f}% {100 * abs(e).mean():8.1f}% "
                f"{100 * abs(e).max():7.1f}%"
            )
    for kind, errs in every.items():
        e = np.concatenate(errs)
        print(
            f"{'all':28s} {kind:9s} {100 * e.mean():+6.1f}% {100 * abs(e).mean():8.1f}% "
            f"{100 * abs(e).max():7.1f}%"
        )
    print(f"(simulated; decode time of the time model over the executor's, {args.ranges} ranges each)")


if __name__ == "__main__":
    main()
