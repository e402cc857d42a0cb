"""verl vs rlhfless on the Ray runtime: same model, same seed, same prompts, side by side.

Runs the default model for a few training steps under each policy on one embedded Ray, with the
planner given this machine's actor slots, and prints per policy: cost per step (the one pricing
model: cold starts and warm functions' keep-alive idle billed), step time, prefill tokens saved,
migrations, cold starts, how many samples came out token-identical, and how close each step's
forecast and the whole run's forecast (made before step 1) came to what was measured.

    .venv/bin/python benchmarks/bench_runtime.py --steps 5 [--order rlhfless verl] [--rounds 2] [KEY=VALUE ...] [--rlhfless KEY=VALUE ...]

The machine drifts by 10-20% over the minutes between two runs, as much as the policies differ, so
`--rounds 2` runs them ABBA (the order, then the reverse) and pools each policy's steps: a drift
steady over the four runs then weighs on both policies alike. Each round's own ratio is printed too.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import psutil
import ray

from rlhfless.config import load_config
from rlhfless.runtime.ray_executor import start_ray
from rlhfless.runtime.trainer import train


def settled(timeout_s: float = 60.0) -> None:
    """Wait until the last run's functions have exited (no `ray::` process left but idle workers
    and Ray's agents), so that the next run's speed probe times the machine alone. A probe that
    reads it slow sets its run's forecast long and, through the run memory, the next run's short:
    this session's first rlhfless run after verl's probed 1.3x and 1.5x slow at two of its three points
    and forecast +46.5%; the next run, probing a quiet machine against that memory, -25.7%."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        names = (p.info["name"] or "" for p in psutil.process_iter(["name"]))
        if not any(n.startswith("ray::") and n != "ray::IDLE" and not n.endswith("Agent") for n in names):
            return
        time.sleep(0.5)


def run_policy(policy: str, steps: int, preset: str, extra: tuple[str, ...], out: Path) -> list[dict]:
    """`rlhfless train` itself under one policy, into run directory `out`, once the last run's
    functions have exited; per step its metrics and sampled responses."""
    shutil.rmtree(out, ignore_errors=True)  # this benchmark's own run: a rerun into --out replaces it
    settled()
    cfg = load_config(
        preset=preset,
        overrides=(
            "runtime.executor=ray",
            f"scheduler.policy={policy}",
            f"trainer.steps={steps}",
            f"output_dir={out}",
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
        lines = (out / "rollouts" / f"step_{row['step']:06d}.jsonl").read_text().split("\n")
        records = [json.loads(line) for line in lines if line]
        tokens = [(r["uid"], r["sample"], r["response"]) for r in records]
        history.append({**row, "time": row["time/step"], "n_actors": row["plan/n_actors"], "tokens": tokens})
    return history


def schedule(order: list[str], rounds: int) -> list[tuple[int, str]]:
    """(round, policy) in the order they run: `order`, then its reverse, and so on (ABBA...)."""
    return [(r, p) for r in range(rounds) for p in (order if r % 2 == 0 else order[::-1])]


def run_dir(out: Path, policy: str, round_: int) -> Path:
    """The first round's runs keep `out/POLICY` (what `bench_targets.py real --baseline` reads)."""
    return out / (policy if round_ == 0 else f"{policy}_{round_ + 1}")


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
        "--rounds",
        type=int,
        default=1,
        help="2: ABBA (the order, then its reverse), each policy's steps pooled",
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
    if args.rounds < 1:
        parser.error(f"--rounds: got {args.rounds}, expected >= 1")
    start_ray(load_config(preset=args.preset, overrides=tuple(args.overrides)).runtime)
    scratch = None if args.out else tempfile.TemporaryDirectory(prefix="bench_runtime.")  # gone at exit
    out = args.out or Path(scratch.name)
    extra = {"verl": tuple(args.overrides), "rlhfless": (*args.overrides, *args.rlhfless)}
    rounds: dict[str, list[list[dict]]] = {p: [] for p in args.order}
    for r, p in schedule(args.order, args.rounds):
        rounds[p].append(run_policy(p, args.steps, args.preset, extra[p], run_dir(out, p, r)))
    ray.shutdown()

    def mean(policy: str, key: str, skip: int = args.skip_first, round_: int | None = None) -> float:
        runs = rounds[policy] if round_ is None else [rounds[policy][round_]]
        return statistics.fmean(h[key] for run in runs for h in run[skip:])

    def total(policy: str, key: str) -> float:
        return sum(h[key] for run in rounds[policy] for h in run) / args.rounds

    if args.rounds > 1:
        print(
            f"\n{args.rounds} rounds, run {' '.join(p for _, p in schedule(args.order, args.rounds))}; "
            "each policy's steps pooled below, totals per run"
        )
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
    same_steps, same_samples, n_samples, n_steps = 0, 0, 0, 0
    for r in range(args.rounds):
        for hv, hr in zip(rounds["verl"][r], rounds["rlhfless"][r], strict=True):
            same = sum(a == b for a, b in zip(hv["tokens"], hr["tokens"], strict=True))
            same_samples += same
            n_samples += len(hv["tokens"])
            same_steps += same == len(hv["tokens"])
            n_steps += 1
            print(
                f"{f'round {r + 1} ' if args.rounds > 1 else ''}step {hv['step']}: "
                f"{same}/{len(hv['tokens'])} samples identical"
            )
    print(f"identical samples: {same_samples}/{n_samples}; identical steps: {same_steps}/{n_steps}")
    for r in range(args.rounds if args.rounds > 1 else 0):
        print(
            f"round {r + 1} alone: cost reduction "
            f"{1 - mean('rlhfless', 'cost/step', round_=r) / mean('verl', 'cost/step', round_=r):.1%}, "
            f"speedup {mean('verl', 'time', round_=r) / mean('rlhfless', 'time', round_=r):.2f}x"
        )
    print(
        f"cost reduction {1 - mean('rlhfless', 'cost/step') / mean('verl', 'cost/step'):.1%}, "
        f"speedup {mean('verl', 'time') / mean('rlhfless', 'time'):.2f}x (steps after the warm-up"
        f"{', every round' if args.rounds > 1 else ''})"
    )
    print("\nforecast against actual (steps after the first; error = forecast / actual - 1):")
    for r, policy in schedule(args.order, args.rounds):
        run, name_ = rounds[policy][r], f"{policy}{f' {r + 1}' if args.rounds > 1 else ''}"
        for name in ("generation_time", "generation_cost", "step_time", "step_cost"):
            errors = [h.get(f"forecast/error/{name}") for h in run[1:]]
            errors = [abs(e) for e in errors if e is not None]
            if errors:
                within = sum(e <= 0.2 for e in errors)
                print(
                    f"  {name_:10s} {name:16s} {within}/{len(errors)} within 20%, "
                    f"mean |error| {100 * statistics.fmean(errors):.1f}%, max {100 * max(errors):.1f}%"
                )
        whole = json.loads((run_dir(out, policy, r) / "forecast.json").read_text())
        actual_t, actual_c = sum(h["time/step"] for h in run), sum(h["cost/step"] for h in run)
        (low_t, high_t), (low_c, high_c) = whole["time_range_s"], whole["cost_range"]
        held = "inside" if low_t <= actual_t <= high_t and low_c <= actual_c <= high_c else "outside"
        print(
            f"  {name_:10s} whole run ({whole['steps']} steps, forecast before step 1): "
            f"time {whole['time_s']:.0f} s vs {actual_t:.0f} s ({whole['time_s'] / actual_t - 1:+.1%}), "
            f"cost {whole['cost']:.4g} vs {actual_c:.4g} ({whole['cost'] / actual_c - 1:+.1%}); "
            f"{held} its range ({low_t:.0f}-{high_t:.0f} s, {low_c:.4g}-{high_c:.4g})"
        )
    if args.json:
        with open(args.json, "w") as f:
            records = {
                p: [[{k: v for k, v in h.items() if k != "tokens"} for h in run] for run in runs]
                for p, runs in rounds.items()
            }
            json.dump(records if args.rounds > 1 else {p: runs[0] for p, runs in records.items()}, f)


if __name__ == "__main__":
    main()
