"""verl vs rlhfless on the Ray runtime: same model, same seed, same prompts, side by side.

Runs the default model for a few training steps under each policy on one embedded Ray, with the
planner given this machine's actor slots, and prints per policy: cost per step (the one pricing
model: cold starts and warm functions' keep-alive idle billed), step time, prefill tokens saved,
migrations, cold starts, how many samples came out token-identical, and how close each step's
forecast and the whole run's forecast (made before step 1) came to what was measured.

    .venv/bin/python benchmarks/bench_runtime.py --steps 5 [--order rlhfless verl] [KEY=VALUE ...] [--rlhfless KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import ray

from rlhfless.config import load_config
from rlhfless.runtime.ray_executor import start_ray
from rlhfless.runtime.trainer import train


def run_policy(policy: str, steps: int, preset: str, extra: tuple[str, ...], out: Path) -> list[dict]:
    """`rlhfless train` itself under one policy; per step its metrics and sampled responses."""
    cfg = load_config(
        preset=preset,
        overrides=(
            "runtime.executor=ray",
            f"scheduler.policy={policy}",
            f"trainer.steps={steps}",
            f"output_dir={out / policy}",
            "trainer.save_every=0",
            "trainer.report=false",
            "trainer.progress=false",
            *extra,
        ),
    )

    def show(kind: str, info: dict) -> None:
        if kind == "step":
            print(
                f"{policy} step {info['step']}: {info['time/step']:.1f} s, cost {info['cost/step']:.6f}",
                flush=True,
            )

    result = train(cfg, show)
    history = []
    for row in result.history:
        lines = (out / policy / "rollouts" / f"step_{row['step']:06d}.jsonl").read_text().split("\n")
        records = [json.loads(line) for line in lines if line]
        tokens = [(r["uid"], r["sample"], r["response"]) for r in records]
        history.append({**row, "time": row["time/step"], "n_actors": row["plan/n_actors"], "tokens": tokens})
    return history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--preset", default="default")
    parser.add_argument("--skip-first", type=int, default=1, help="warm-up steps left out of the means")
    parser.add_argument("--json", help="write the per-step records here")
    parser.add_argument(
        "--order", nargs=2, default=["verl", "rlhfless"], help="which policy runs first (machine drift)"
    )
    parser.add_argument(
        "--out", type=Path, help="keep both run directories here (default: a temp dir, removed at exit)"
    )
    parser.add_argument(
        "--rlhfless",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="overrides for the rlhfless run alone, after those for both (e.g. runtime.learner_width=1); "
        "one that changes an update (a learner width) may change later steps' samples",
    )
    parser.add_argument("overrides", nargs="*", help="extra key=value config overrides for both runs")
    args = parser.parse_args()
    if sorted(args.order) != ["rlhfless", "verl"]:
        parser.error(f"--order: got {args.order}, expected verl and rlhfless in some order")
    start_ray(load_config(preset=args.preset, overrides=tuple(args.overrides)).runtime)
    scratch = None if args.out else tempfile.TemporaryDirectory(prefix="bench_runtime.")  # gone at exit
    out = args.out or Path(scratch.name)
    extra = {"verl": tuple(args.overrides), "rlhfless": (*args.overrides, *args.rlhfless)}
    runs = {p: run_policy(p, args.steps, args.preset, extra[p], out) for p in args.order}
    ray.shutdown()

    def mean(policy: str, key: str, skip: int = args.skip_first) -> float:
        return statistics.fmean(h[key] for h in runs[policy][skip:])

    def total(policy: str, key: str) -> float:
        return sum(h[key] for h in runs[policy])

    rows = [
        ("cost per step ($, steps > warm-up)", mean("verl", "cost/step"), mean("rlhfless", "cost/step")),
        ("cost per step ($, all steps)", mean("verl", "cost/step", 0), mean("rlhfless", "cost/step", 0)),
        ("step time (s, steps > warm-up)", mean("verl", "time"), mean("rlhfless", "time")),
        (
            "generation time (s, steps > warm-up)",
            mean("verl", "time/generation"),
            mean("rlhfless", "time/generation"),
        ),
        (
            "learning time (s, steps > warm-up)",
            mean("verl", "time/learning"),
            mean("rlhfless", "time/learning"),
        ),
        ("generation cost ($/step)", mean("verl", "cost/generation"), mean("rlhfless", "cost/generation")),
        ("generation time / its floor", mean("verl", "floor/time_over"), mean("rlhfless", "floor/time_over")),
        (
            "generation cost / work floor",
            mean("verl", "floor/cost_over"),
            mean("rlhfless", "floor/cost_over"),
        ),
        ("decode actors (mean)", mean("verl", "n_actors", 0), mean("rlhfless", "n_actors", 0)),
        (
            "prefill tokens saved (all steps)",
            total("verl", "prefill/tokens_naive") - total("verl", "prefill/tokens_computed"),
            total("rlhfless", "prefill/tokens_naive") - total("rlhfless", "prefill/tokens_computed"),
        ),
        ("migrations (all steps)", total("verl", "migrations"), total("rlhfless", "migrations")),
        (
            "cold starts (all steps)",
            total("verl", "actors/cold_starts"),
            total("rlhfless", "actors/cold_starts"),
        ),
        ("idle billed seconds (all steps)", total("verl", "time/idle"), total("rlhfless", "time/idle")),
        (
            "keep-alive cost ($, all steps)",
            total("verl", "cost/keep_alive"),
            total("rlhfless", "cost/keep_alive"),
        ),
    ]
    print(f"\n{'':38s} {'verl':>12s} {'rlhfless':>12s} {'rlhfless/verl':>14s}")
    for name, a, b in rows:
        print(f"{name:38s} {a:12.6g} {b:12.6g} {b / a if a else float('nan'):14.3f}")
    same_steps, same_samples, n_samples = 0, 0, 0
    for hv, hr in zip(runs["verl"], runs["rlhfless"], strict=True):
        same = sum(a == b for a, b in zip(hv["tokens"], hr["tokens"], strict=True))
        same_samples += same
        n_samples += len(hv["tokens"])
        same_steps += same == len(hv["tokens"])
        print(f"step {hv['step']}: {same}/{len(hv['tokens'])} samples identical")
    print(f"identical samples: {same_samples}/{n_samples}; identical steps: {same_steps}/{len(runs['verl'])}")
    print(
        f"cost reduction {1 - mean('rlhfless', 'cost/step') / mean('verl', 'cost/step'):.1%}, "
        f"speedup {mean('verl', 'time') / mean('rlhfless', 'time'):.2f}x (steps after the warm-up)"
    )
    print("\nforecast against actual (steps after the first; error = forecast / actual - 1):")
    for policy in args.order:
        for name in ("generation_time", "generation_cost", "step_time", "step_cost"):
            errors = [h.get(f"forecast/error/{name}") for h in runs[policy][1:]]
            errors = [abs(e) for e in errors if e is not None]
            if errors:
                within = sum(e <= 0.2 for e in errors)
                print(
                    f"  {policy:8s} {name:16s} {within}/{len(errors)} within 20%, "
                    f"mean |error| {100 * statistics.fmean(errors):.1f}%, max {100 * max(errors):.1f}%"
                )
        whole = json.loads((out / policy / "forecast.json").read_text())
        actual_t, actual_c = total(policy, "time/step"), total(policy, "cost/step")
        print(
            f"  {policy:8s} whole run ({whole['steps']} steps, forecast before step 1): "
            f"time {whole['time_s']:.0f} s vs {actual_t:.0f} s ({whole['time_s'] / actual_t - 1:+.1%}), "
            f"cost {whole['cost']:.4g} vs {actual_c:.4g} ({whole['cost'] / actual_c - 1:+.1%})"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {p: [{k: v for k, v in h.items() if k != "tokens"} for h in hs] for p, hs in runs.items()}, f
            )


if __name__ == "__main__":
    main()
