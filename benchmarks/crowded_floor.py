"""How loose the latency floor is where many sequences run to the cap (simulated).

The floor of `planner/floor.py` (the issue's definition) takes the longest sequence decoded alone.
Where hundreds of sequences run to the response cap (LCB-like data), they cannot all run alone:
the k longest, each needing its own length in sequential decode steps, share A actors, so some
actor holds m = ceil(k / A) of them and finishes them no sooner than m * L_k tokens at its best
rate with at most m (and what its KV memory holds) at once. That is a lower bound for every k;
k = 1 is the latency floor. This script takes the largest over k for each step of a preset's
workload, and prints each policy's generation time over the issue's floor and over this tighter
bound, from a `rlhfless simulate` output directory of the same preset.

    .venv/bin/rlhfless simulate --preset paper-physical --no-sweeps --output /tmp/pp
    .venv/bin/python benchmarks/crowded_floor.py paper-physical /tmp/pp
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from rlhfless.planner.profile import Profile
from rlhfless.sim.config import build
from rlhfless.sim.presets import preset
from rlhfless.sim.runner import make_stage, make_workload


def crowded_latency(profile: Profile, prompt: np.ndarray, lengths: np.ndarray, actors: int) -> float:
    """Seconds no schedule on `actors` actors beats: the largest over k of the k longest sequences'
    bound (see the module docstring)."""
    order = np.argsort(-lengths, kind="stable")
    n, p = lengths[order].astype(float), prompt[order].astype(float)
    m = np.ceil(np.arange(1, n.size + 1) / actors)
    limit = np.minimum(m, profile.concurrency(p + n))  # sequences one actor may run at once
    grid = np.broadcast_to(profile.decode_batch.astype(float), (n.size, profile.decode_batch.size))
    batches = np.concatenate([grid, limit[:, None]], axis=1)  # step time is linear between points
    step = profile.decode_step_seconds(batches, (p + (n - 1) / 2)[:, None])
    rate = np.where(batches <= limit[:, None], batches / np.maximum(step, 1e-12), 0.0).max(axis=1)
    return float((m * n / rate).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", choices=("paper-physical", "paper-sim"))
    parser.add_argument("output", type=Path, help="the `rlhfless simulate --output` directory of it")
    args = parser.parse_args()
    rows = [json.loads(line) for line in (args.output / "steps.jsonl").read_text().splitlines() if line]
    variants = ("verl", "rlhfless")
    print(
        f"{'scenario (simulated)':26s} {'floor s':>8s} {'crowded':>8s}"
        + "".join(f" {v + ' /floor':>15s} {'/crowded':>9s}" for v in variants)
    )
    for name, tree in preset(args.preset):
        cfg = build(tree)
        stage, workload = make_stage(cfg), make_workload(cfg)
        actors = cfg.cluster.total_gpus // cfg.model.tp
        steps = {(r["variant"], r["step"]): r for r in rows if r["scenario"] == name}
        floor, crowded, generation = [], [], {v: [] for v in variants}
        for k in range(cfg.training.steps):
            prompts = workload.step(k)
            g = prompts.lengths.shape[1]
            issue = steps[("rlhfless", k)]["floor_time"]
            bound = crowded_latency(
                stage.profile, np.repeat(prompts.prompt_lengths, g), prompts.lengths.ravel(), actors
            )
            floor.append(issue)
            crowded.append(max(issue, bound))
            for v in variants:
                generation[v].append(steps[(v, k)]["generation"])
        line = f"{name:26s} {np.mean(floor):8.1f} {np.mean(crowded):8.1f}"
        for v in variants:
            line += f" {sum(generation[v]) / sum(floor):15.2f} {sum(generation[v]) / sum(crowded):9.2f}"
        print(line)
    print(
        "(simulated; generation time over the issue's floor and over the crowded-latency bound, summed over steps)"
    )


if __name__ == "__main__":
    main()
