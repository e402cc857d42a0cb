"""How far the throughput floor moves when an actor's batch is capped by KV at final lengths (simulated).

The issue's throughput floor (`planner/floor.py`) lets each actor run the batch its KV memory holds
at the token-weighted mean context, p + (L - 1) / 2: the KV a paged engine holds on average over a
sequence's life. The simulated engine, like ours, admits by final lengths instead (prompt plus
response, `sim.execution.slot_cap`; ours reserves prompt + max_new_tokens), so that it never has
to preempt. Where the batch is KV-bound (GPQA- and LCB-like data on TP 4 actors), that admission
runs fewer sequences at once than the floor assumes. This script prints, per step of a preset's
first scenarios, both floors (the best over the cluster's actor sizes, at the same step time) and,
given a `rlhfless simulate` output directory of the same preset, rlhfless's generation over each.

    .venv/bin/rlhfless simulate --preset paper-sim --no-sweeps --output /tmp/ps
    .venv/bin/python benchmarks/kv_floor.py paper-sim /tmp/ps
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from rlhfless.planner.floor import best_throughput
from rlhfless.planner.profile import Profile
from rlhfless.sim.config import build
from rlhfless.sim.presets import preset
from rlhfless.sim.runner import make_stage, make_workload


def throughput_floors(
    profile: Profile, actors: int, prompt: np.ndarray, lengths: np.ndarray
) -> tuple[float, float]:
    """(the issue's throughput floor, the same with the batch capped by KV at final lengths), s."""
    tokens = float(lengths.sum())
    context = float((lengths * (prompt + (lengths - 1) / 2)).sum() / tokens)
    share = int(np.ceil(lengths.size / actors))
    issue, _ = best_throughput(profile, context, share)
    cap = max(1, min(int(profile.concurrency(float(np.mean(prompt + lengths)))), share))
    batches = np.unique(np.r_[profile.decode_batch[profile.decode_batch <= cap].astype(np.int64), cap, 1])
    final = float(np.max(batches / profile.decode_step_seconds(batches, context)))
    return tokens / (issue * actors), tokens / (final * actors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset")
    parser.add_argument("simulated", nargs="?", type=Path, help="a `rlhfless simulate` output directory")
    args = parser.parse_args()
    generation: dict[tuple[str, int], float] = {}
    if args.simulated:
        for line in (args.simulated / "steps.jsonl").read_text().splitlines():
            row = json.loads(line)
            if row["variant"] == "rlhfless":
                generation[(row["scenario"], row["step"])] = row["generation"]
    for name, tree in preset(args.preset):
        cfg = build(tree)
        stage, workload = make_stage(cfg), make_workload(cfg)
        issue, final, over = [], [], []
        for step in range(cfg.training.steps):
            prompts = workload.step(step)
            samples = prompts.lengths.shape[1]
            prompt = np.repeat(prompts.prompt_lengths, samples).astype(float)
            lengths = prompts.lengths.ravel().astype(float)
            floors = [
                throughput_floors(p, stage.cluster.max_actors(p.gpus), prompt, lengths)
                for p in stage.every_profile()
            ]
            issue.append(min(f[0] for f in floors))
            final.append(min(f[1] for f in floors))
            if (name, step) in generation:
                over.append((generation[(name, step)] / issue[-1], generation[(name, step)] / final[-1]))
        line = (
            f"{name} (simulated): throughput floor {statistics.fmean(issue):.1f} s, with final-length KV "
            f"{statistics.fmean(final):.1f} s"
        )
        if over:
            line += (
                f"; rlhfless's generation over them {statistics.fmean(o[0] for o in over):.2f}x and "
                f"{statistics.fmean(o[1] for o in over):.2f}x"
            )
        print(line, flush=True)


if __name__ == "__main__":
    main()
