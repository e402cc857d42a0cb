"""Generation against its floor on clusters the presets do not hold (simulated).

Each scenario runs verl and rlhfless for a few steps on the same workload (from a fresh length
predictor: the first epoch's prompts are unseen) and prints, per scenario, each policy's
generation time over its floor, rlhfless's generation speedup and cost reduction against verl,
and the whole step's. The scenarios vary the GPU, the model, the tensor parallelism, the samples
per prompt (4-16), the response cap (1k-8k tokens), the dataset's length shape and the algorithm;
none of them was tuned to. `key=value` arguments override rlhfless's scheduler (e.g.
`migration=auto`, `lam=1.0`).

    .venv/bin/python benchmarks/bench_floor.py [--steps 8] [--only NAME] [scheduler.key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np

from rlhfless.sim import experiments
from rlhfless.sim.config import build
from rlhfless.sim.runner import VARIANTS, make_stage, make_workload, run_policy

# name: (gpu, nodes, model, tp, dataset, prompts per step, samples, cap, algorithm)
SCENARIOS: dict[str, tuple[str, int, str, int, str, int, int, int, str]] = {
    "h100-70b-tp8-gsm8k-g8-4k": ("h100", 4, "llama-2-70b", 8, "gsm8k", 1024, 8, 4096, "grpo"),
    "h100-70b-tp4-gpqa-g4-2k": ("h100", 4, "llama-2-70b", 4, "gpqa", 2048, 4, 2048, "grpo"),
    "a100-7b-tp1-lcb-g16-8k": ("a100", 2, "llama-2-7b", 1, "lcb", 256, 16, 8192, "grpo"),
    "h200-q7b-tp2-gsm8k-g16-1k": ("h200", 2, "qwen2.5-7b", 2, "gsm8k", 512, 16, 1024, "grpo"),
    "l40s-q3b-tp1-gpqa-g8-4k": ("l40s", 4, "qwen2.5-3b", 1, "gpqa", 512, 8, 4096, "grpo"),
    "a100-q7b-tp4-lcb-ppo-2k": ("a100", 1, "qwen2.5-7b", 4, "lcb", 1024, 1, 2048, "ppo"),
    "h100-7b-tp2-gsm8k-g12-8k": ("h100", 2, "llama-2-7b", 2, "gsm8k", 512, 12, 8192, "grpo"),
    "l40s-q7b-tp1-lcb-g8-1k": ("l40s", 2, "qwen2.5-7b", 1, "lcb", 256, 8, 1024, "grpo"),
}


def scenario_tree(spec: tuple[str, int, str, int, str, int, int, int, str], steps: int) -> dict[str, Any]:
    gpu, nodes, model, tp, dataset, prompts, samples, cap, algorithm = spec
    return {
        "cluster": {"nodes": nodes, "gpus_per_node": 8, "gpu": gpu},
        "model": {"name": model, "tp": tp},
        "workload": {
            "dataset": dataset,
            "prompts_per_step": prompts,
            "samples": samples,
            "max_response": cap,
            "seed": 7,
        },
        "training": {"algorithm": algorithm, "steps": steps},
    }


def parse(items: list[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, _, raw = item.partition("=")
        try:
            out[key.removeprefix("scheduler.")] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.removeprefix("scheduler.")] = raw
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--only", default="", help="run the scenarios whose name holds this")
    parser.add_argument("overrides", nargs="*", help="rlhfless scheduler key=value")
    args = parser.parse_args()
    overrides = parse(args.overrides)
    header = (
        f"{'scenario (simulated)':28s} {'verl/fl':>8s} {'rlhf/fl':>8s} {'gen x':>6s} {'gen $-%':>8s} "
        f"{'step x':>7s} {'step $-%':>9s} {'N':>5s} {'s':>5s}"
    )
    print(header)
    rows = []
    for name, spec in SCENARIOS.items():
        if args.only and args.only not in name:
            continue
        t0 = time.perf_counter()
        cfg = build(scenario_tree(spec, args.steps))
        stage = make_stage(cfg)
        results = {
            "verl": run_policy(cfg, VARIANTS["verl"], args.steps, stage, make_workload(cfg)),
            "rlhfless": run_policy(
                cfg, {**VARIANTS["rlhfless"], **overrides}, args.steps, stage, make_workload(cfg)
            ),
        }
        s = experiments.summarize(results)
        v, r = s["verl"], s["rlhfless"]
        rows.append(r)
        print(
            f"{name:28s} {v['generation_over_floor']:7.2f}x {r['generation_over_floor']:7.2f}x "
            f"{r['generation_speedup']:5.2f}x {100 * r['generation_cost_reduction']:7.1f}% "
            f"{r['speedup']:6.2f}x {100 * r['cost_reduction']:8.1f}% {r['mean_actors']:5.1f} "
            f"{time.perf_counter() - t0:5.1f}",
            flush=True,
        )
    if not rows:
        return
    over = np.array([r["generation_over_floor"] for r in rows])
    faster = np.array([r["generation_speedup"] for r in rows])
    cheaper = np.array([r["generation_cost_reduction"] for r in rows])
    print(
        f"rlhfless generation over floor {over.min():.2f}-{over.max():.2f}x (<= 1.25x in "
        f"{int((over <= 1.25).sum())}/{over.size}); not slower than verl in "
        f"{int((faster >= 1.0).sum())}/{faster.size}; generation cost reduction {100 * cheaper.min():.0f}% "
        f"to {100 * cheaper.max():.0f}% (>= 40% in {int((cheaper >= 0.4).sum())}/{cheaper.size})"
    )
    print(f"(simulated; {args.steps} steps each; load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
