"""Time a full RLHFless plan: 16,384 prompts x 8 samples, N in [1, 160] (every N up to 24, a grid past it).

Workload: a 60-token shared system prompt plus 20-120 unique tokens per prompt, half the prompts
with a history (log-normal lengths) and half with only an answer length; Llama-2-7B roofline
profile on H100, 20 nodes x 8 GPUs, one GPU per actor. Prints the best and the median of
`--repeat` runs of each phase and of the whole plan, next to the 50 ms goal. The runtime hands
the planner token lists as the tokenizer returns them (Python lists), the simulator numpy arrays:
both are timed.

    .venv/bin/python benchmarks/bench_planner.py [--prompts 16384] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.dedup import PackedPrompts, deduplicate
from rlhfless.planner.hardware import ModelShape, roofline_profile
from rlhfless.planner.placement import ClusterSpec
from rlhfless.planner.plan import plan_step
from rlhfless.planner.predictor import LengthPredictor
from rlhfless.planner.step_plan import PromptSpec

GOAL_MS = 50.0


def timed_ms(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """(best, median) milliseconds of `repeat` runs."""
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return min(runs) * 1e3, float(np.median(runs)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16384)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    system = rng.integers(0, 32000, 60)
    prompts = [
        PromptSpec(
            f"p{i}",
            np.concatenate((system, rng.integers(0, 32000, int(rng.integers(20, 121))))).astype(np.int32),
            int(rng.integers(50, 400)),
        )
        for i in range(args.prompts)
    ]
    predictor = LengthPredictor()
    lengths = np.minimum(rng.lognormal(5.5, 0.8, (args.prompts, args.group_size)), 2048).astype(int)
    for p, row in zip(prompts[::2], lengths[::2], strict=False):
        predictor.update(p.uid, row.tolist())
    # A run past its first step times its plans with the tail it measured (`tail.Tail`): here,
    # 1,024 other prompts' group maxima drawn around their planned ones.
    planned = np.minimum(rng.lognormal(5.5, 0.8, 1024), 2048)
    drawn = np.minimum(planned[:, None] * rng.lognormal(0.0, 0.3, (1024, args.group_size)), 2048)
    predictor.update_many([f"t{i}" for i in range(1024)], drawn, 2048, planned.tolist())
    first = LengthPredictor()  # the same before any tail: a run's first step
    first.load_state_dict({**predictor.state_dict(), "max_ratios": [], "source_ratios": []})
    shape = ModelShape.resolve("llama-2-7b")
    profile = roofline_profile(shape, "h100", 1)
    cluster = ClusterSpec(
        nodes=20,
        gpus_per_node=8,
        intra_node_bandwidth=311e9,
        inter_node_bandwidth=36e9,
        model_bytes=shape.weight_bytes,
        kv_bytes_per_token=shape.kv_bytes_per_token,
    )
    config = SchedulerConfig()
    g = args.group_size
    uids = [p.uid for p in prompts]
    answers = [p.answer_tokens for p in prompts]
    as_lists = [PromptSpec(p.uid, p.prompt_tokens.tolist(), p.answer_tokens) for p in prompts]
    packed = PackedPrompts.pack([p.prompt_tokens for p in prompts])
    plan = plan_step(prompts, predictor, profile, cluster, config, g)
    verl = SchedulerConfig(policy="verl")

    def run(fn: Callable[[], Any]) -> tuple[float, float]:
        return timed_ms(fn, args.repeat)

    rows = [
        ("predict (group max/mean)", run(lambda: predictor.predict(uids, answers))),
        (
            "pack arrays (sort + prefixes)",
            run(lambda: PackedPrompts.pack([p.prompt_tokens for p in prompts])),
        ),
        ("pack Python lists", run(lambda: PackedPrompts.pack([p.prompt_tokens for p in as_lists]))),
        ("dedup: prefix tree (default)", run(lambda: deduplicate(packed, config.prefill_capacity, "tree"))),
        ("dedup: paper's D(L)", run(lambda: deduplicate(packed, config.prefill_capacity, "paper"))),
        ("full plan", run(lambda: plan_step(prompts, predictor, profile, cluster, config, g))),
        (
            "full plan, no tail yet (a first step)",
            run(lambda: plan_step(prompts, first, profile, cluster, config, g)),
        ),
        (
            "full plan from Python lists",
            run(lambda: plan_step(as_lists, predictor, profile, cluster, config, g)),
        ),
        (
            "verl policy (no dedup, N fixed)",
            run(lambda: plan_step(prompts, predictor, profile, cluster, verl, g)),
        ),
    ]
    tokens = sum(len(p.prompt_tokens) for p in prompts)
    ns = [c["n"] for c in plan.candidates]
    print(
        f"{args.prompts} prompts x {g} samples, {tokens} prompt tokens, "
        f"N in [{min(ns)}, {max(ns)}] ({len(ns)} candidates timed: a grid past 24)"
    )
    print(
        f"chosen N = {plan.n_actors}, prefix length {plan.prefix_length}, predicted step {plan.predicted_time:.1f} s"
    )
    print(
        f"prefill ({plan.prefill['rule']}): {len(plan.prefix_tree)} levels, {plan.prefill['tokens_computed']} "
        f"prompt tokens computed, {plan.prefill['tokens_unique']} unique: ratio {plan.prefill['tree_ratio']:.4f}"
    )
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (timings scale with contention)")
    print(f"{'phase':34s} {'best ms':>9s} {'median':>9s} {'best / goal':>12s}")
    for name, (best, median) in rows:
        print(f"{name:34s} {best:9.1f} {median:9.1f} {best / GOAL_MS:12.2f}")


if __name__ == "__main__":
    main()
