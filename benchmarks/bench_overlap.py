"""Preparation overlapped with generation's tail, on and off, side by side on the Ray runtime.

Trains the same config twice on one embedded Ray, `scheduler.overlap_preparation` on and off (in
the order given), and prints per run the preparation run during generation and what was left
after it, the step's time and cost, and on/off ratios; then whether samples, rewards, the policy
loss and the final weights came out the same (they must, to the bit). Times on a shared machine
compare only side by side, as ratios.

    .venv/bin/python benchmarks/bench_overlap.py --steps 2 algorithm.kl_coef=0.001
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path

import ray
from safetensors.torch import load_file

from rlhfless.config import load_config
from rlhfless.runtime.ray_cluster import start_ray
from rlhfless.runtime.trainer import train

KEYS = (
    "time/step",
    "time/generation",
    "time/preparation",
    "time/prep_overlapped",
    "prep/overlapped_groups",
    "time/reward",
    "time/reference",
    "cost/step",
    "cost/preparation",
    "plan/n_actors",
    "learner/width",
)


def run(overlap: str, steps: int, preset: str, extra: tuple[str, ...], out: Path) -> dict:
    """`rlhfless train` itself with overlap `on` or `off`: its metrics, rollouts and final weights."""
    # this benchmark's own run: a rerun into --out replaces it
    shutil.rmtree(out / overlap, ignore_errors=True)
    cfg = load_config(
        preset=preset,
        overrides=(
            "runtime.executor=ray",
            "scheduler.policy=rlhfless",
            f"scheduler.overlap_preparation={overlap == 'on'}",
            f"trainer.steps={steps}",
            f"output_dir={out / overlap}",
            "trainer.save_every=0",  # the last step's checkpoint only: its weights are compared
            "trainer.report=false",
            "trainer.progress=false",
            *extra,
        ),
    )
    history = train(cfg).history
    rollouts = []
    for row in history:
        lines = (out / overlap / "rollouts" / f"step_{row['step']:06d}.jsonl").read_text().splitlines()
        rollouts.append([(r["uid"], r["sample"], r["response"], r["reward"]) for r in map(json.loads, lines)])
    weights = load_file(out / overlap / "checkpoints" / f"step_{steps:06d}" / "model.safetensors")
    return {"history": history, "rollouts": rollouts, "weights": weights}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--preset", default="default")
    parser.add_argument("--order", nargs=2, default=["on", "off"], help="which runs first (machine drift)")
    parser.add_argument(
        "--out", type=Path, help="keep both run directories here (default: a temp dir, removed at exit)"
    )
    parser.add_argument("overrides", nargs="*", help="extra key=value config overrides for both runs")
    args = parser.parse_args()
    if sorted(args.order) != ["off", "on"]:
        parser.error(f"--order: got {args.order}, expected on and off in some order")
    start_ray(load_config(preset=args.preset, overrides=tuple(args.overrides)).runtime)
    scratch = None if args.out else tempfile.TemporaryDirectory(prefix="bench_overlap.")  # gone at exit
    out = args.out or Path(scratch.name)
    runs = {o: run(o, args.steps, args.preset, tuple(args.overrides), out) for o in args.order}
    ray.shutdown()

    print(f"\n{'mean over steps':24s} {'on':>10s} {'off':>10s} {'on/off':>8s}   per step (on | off)")
    for key in KEYS:
        per = {o: [h.get(key, 0.0) for h in runs[o]["history"]] for o in ("on", "off")}
        on, off = statistics.fmean(per["on"]), statistics.fmean(per["off"])
        steps = " ".join(f"{a:.4g}|{b:.4g}" for a, b in zip(per["on"], per["off"], strict=True))
        print(f"{key:24s} {on:10.4g} {off:10.4g} {on / off if off else float('nan'):8.3f}   {steps}")
    same_rollouts = runs["on"]["rollouts"] == runs["off"]["rollouts"]
    losses = [[h["loss/policy"] for h in runs[o]["history"]] for o in ("on", "off")]
    a, b = runs["on"]["weights"], runs["off"]["weights"]
    same_weights = a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    moved = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    n = sum(len(r) for r in runs["on"]["rollouts"])
    print(f"\nsamples and rewards identical: {same_rollouts} ({n} samples)")
    print(f"policy loss identical: {losses[0] == losses[1]}; final weights identical: {same_weights}", end="")
    print(f" (largest difference {moved:.3g}; a learning phase of another width sums in another order)")


if __name__ == "__main__":
    main()
