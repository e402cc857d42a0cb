"""rlhfless against verl on random clusters, models and workloads no preset holds (simulated).

Each scenario is drawn from a seed: GPU (H100, A100, L40S, H200), 1-4 nodes of 8, model
(Llama-2-7B/70B, Qwen2.5-3B/7B), tensor parallelism 1-8, dataset shape (GSM8K-, GPQA-, LCB-like),
64-1,024 prompts a step, 1-16 samples, a 1k-8k cap, GRPO or PPO. A scenario whose model does not
fit its tensor-parallel size is refused, as `rlhfless simulate` refuses it. Each scenario runs
verl and rlhfless for `--steps` steps on the same workload and prints generation over its floor
(verl's, rlhfless's), rlhfless's generation and whole-step speedup and cost reduction against
verl, the most any schedule could save on generation (`bnd $-%`: verl's generation cost over the
work floor), the error of rlhfless's generation forecasts after the first step (actual over
forecast, less 1: the mean and the mean |error|), and flags a scenario where rlhfless generates
slower (under 0.995x) or costs more. Each seed's summary counts them, the scenarios whose
generation is within 1.25x its floor and those 40% cheaper (and where the work floor allows it),
and pools the forecast errors; several seeds (`--seed 1 2 3`) are one sweep each, their summaries
printed together at the end.

    .venv/bin/python benchmarks/bench_sweep.py [--count 60] [--steps 8] [--seed 1 [2 ...]]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from bench_floor import scenario_tree

from rlhfless.sim import experiments
from rlhfless.sim.config import build
from rlhfless.sim.runner import VARIANTS, make_stage, make_workload, run_policy


def draw(rng: np.random.Generator) -> tuple[str, int, str, int, str, int, int, int, str]:
    def pick(options):
        return options[int(rng.integers(len(options)))]

    algorithm = pick(["grpo", "grpo", "ppo"])
    gpu, nodes = pick(["h100", "a100", "l40s", "h200"]), pick([1, 2, 4])
    model, tp = pick(["llama-2-7b", "llama-2-70b", "qwen2.5-3b", "qwen2.5-7b"]), pick([1, 2, 4, 8])
    dataset, prompts = pick(["gsm8k", "gpqa", "lcb"]), pick([64, 256, 1024])
    samples = 1 if algorithm == "ppo" and rng.random() < 0.5 else pick([4, 8, 12, 16])
    return gpu, nodes, model, tp, dataset, prompts, samples, pick([1024, 2048, 4096, 8192]), algorithm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=60)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seed", type=int, nargs="+", default=[1], help="one sweep per seed")
    args = parser.parse_args()
    print(
        f"{'scenario (simulated)':52s} {'verl/fl':>7s} {'rlhf/fl':>7s} {'gen x':>6s} {'gen $-%':>8s} "
        f"{'bnd $-%':>8s} {'step x':>7s} {'step $-%':>9s} {'N':>5s} {'fc %':>6s} {'|fc| %':>6s}"
    )
    summaries = [sweep(seed, args.count, args.steps) for seed in args.seed]
    print("\n".join(line for line in summaries if line))
    print(f"(simulated; {args.steps} steps each; load average {os.getloadavg()[0]:.1f})")


def sweep(seed: int, count: int, steps: int) -> str:
    """Print `count` scenarios drawn from `seed`, one row each; return the seed's summary line."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        spec = draw(rng)
        name = "-".join(map(str, spec))
        try:
            cfg = build(scenario_tree(spec, steps))
            stage = make_stage(cfg)
        except ValueError as err:  # e.g. the model does not fit its tensor-parallel size
            print(f"{name:52s} refused: {err}")
            continue
        t0 = time.perf_counter()
        results = {
            policy: run_policy(cfg, VARIANTS[policy], steps, stage, make_workload(cfg))
            for policy in ("verl", "rlhfless")
        }
        s = experiments.summarize(results)
        v, r = s["verl"], s["rlhfless"]
        flags = [
            flag
            for flag, bad in (
                ("slower", r["generation_speedup"] < 0.995),
                ("dearer", r["generation_cost_reduction"] < 0.0),
            )
            if bad
        ]
        errors = [
            x.generation / x.predicted_time - 1.0 for x in results["rlhfless"][1:] if x.predicted_time > 0
        ]
        fc = (statistics.fmean(errors), statistics.fmean(map(abs, errors))) if errors else (0.0, 0.0)
        rows.append(r | {"forecast_error": fc[0], "forecast_abs_error": fc[1]})
        print(
            f"{name:52s} {v['generation_over_floor']:6.2f}x {r['generation_over_floor']:6.2f}x "
            f"{r['generation_speedup']:5.2f}x {100 * r['generation_cost_reduction']:7.1f}% "
            f"{100 * r['generation_bound_cost_reduction']:7.1f}% {r['speedup']:6.2f}x "
            f"{100 * r['cost_reduction']:8.1f}% {r['mean_actors']:5.1f} "
            f"{100 * fc[0]:6.1f} {100 * fc[1]:6.1f} {' '.join(flags)} ({time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
    if not rows:
        return ""
    speed = [r["generation_speedup"] for r in rows]
    cheaper = [r["generation_cost_reduction"] for r in rows]
    over = [r["generation_over_floor"] for r in rows]
    bound = [r["generation_bound_cost_reduction"] for r in rows]
    return (
        f"seed {seed}, {len(rows)} scenarios: generation {statistics.geometric_mean(speed):.3f}x verl's speed "
        f"(geometric mean; least {min(speed):.2f}x), {100 * statistics.fmean(cheaper):.1f}% cheaper (mean); "
        f"{statistics.geometric_mean(over):.3f}x its floor (geometric mean; within 1.25x in "
        f"{sum(x <= 1.25 for x in over)}); 40% cheaper in {sum(x >= 0.4 for x in cheaper)}, "
        f"where the work floor allows it in {sum(x >= 0.4 for x in bound)}; "
        f"slower than verl in {sum(x < 0.995 for x in speed)}, dearer in {sum(x < 0 for x in cheaper)}; "
        f"whole step {statistics.geometric_mean([r['speedup'] for r in rows]):.3f}x, "
        f"{100 * statistics.fmean(r['cost_reduction'] for r in rows):.1f}% cheaper; generation forecast "
        f"error {100 * statistics.fmean(r['forecast_error'] for r in rows):+.1f}% "
        f"(mean |error| {100 * statistics.fmean(r['forecast_abs_error'] for r in rows):.1f}%)"
    )


if __name__ == "__main__":
    main()
