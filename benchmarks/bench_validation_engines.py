"""Validation under the Ray executor: the held-out set on decode functions the planner sizes
(`validation.engine=functions`, the default) against the learner's own engine (`learner`), side
by side on one executor.

Workload: the default preset's held-out set (`validation.size` reasoning-gym prompts, greedy, cap
`generation.max_new_tokens`), SmolLM2-135M-Instruct, this machine's slots. The sides alternate
`--repeats` times on one Ray executor, the functions' side first: its first validation starts
its functions cold, as a run's step-0 validation may; later ones find them warm, as validations
after a step do. Prints every validation's seconds and cost (functions: metered; learner: its
units for its seconds), each side's best, the ratio of the bests, the functions the plans took,
the plans' forecasts, and how many held-out responses came out the same.

    .venv/bin/python benchmarks/bench_validation_engines.py [--size 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

from rlhfless.config import load_config
from rlhfless.planner import LengthPredictor
from rlhfless.rewards import build_reward_fn
from rlhfless.runtime.planning import build_planner
from rlhfless.runtime.run_inputs import load_inputs
from rlhfless.runtime.trainer import answer_lengths, build_executor, tokenize_prompts
from rlhfless.runtime.validation import Validator
from rlhfless.runtime.validation_functions import FunctionsDecode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cfg = load_config(
        preset="default",
        overrides=("validation.every=1", f"validation.size={args.size}", "runtime.executor=ray"),
    )
    tokenizer, _, held_out, policy = load_inputs(cfg)
    planner = build_planner(cfg, policy)
    executor = build_executor(cfg, tokenizer, policy)
    executor.warm_up()
    prompts = tokenize_prompts(held_out, tokenizer, cfg.generation.max_prompt_tokens)
    decode = FunctionsDecode(
        executor, planner, LengthPredictor.from_config(cfg.scheduler), answer_lengths(prompts, tokenizer)
    )
    reward = build_reward_fn(cfg.reward)
    sides = {
        "functions": Validator(cfg, prompts, executor.engine, tokenizer, reward, decode),
        "learner's engine": Validator(cfg, prompts, executor.engine, tokenizer, reward),
    }
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    records: dict[str, list[dict]] = {}
    try:
        for repeat in range(args.repeats):
            for name, validator in sides.items():
                start = time.perf_counter()
                done = validator.run(0)
                metrics, records[name] = done.metrics, done.records
                metrics["wall"] = time.perf_counter() - start
                runs[name].append(metrics)
                actors = metrics.get("validation/actors")
                on = ""
                if actors is not None:  # the plan's forecast beside it
                    on = (
                        f", {actors:.0f} function(s), forecast {metrics['validation/predicted_time']:.2f} s "
                        f"${metrics['validation/predicted_cost']:.5f}"
                    )
                print(
                    f"repeat {repeat + 1} {name:17s} {metrics['wall']:6.2f} s  "
                    f"${metrics['cost/validation']:.5f}{on}",
                    flush=True,
                )
    finally:
        executor.close()
    best = {name: min(r["wall"] for r in rs) for name, rs in runs.items()}
    cheapest = {name: min(r["cost/validation"] for r in rs) for name, rs in runs.items()}
    functions, learner = best.values()
    cost_ratio = cheapest["functions"] / cheapest["learner's engine"]
    same = sum(a["response"] == b["response"] for a, b in zip(*records.values(), strict=True))
    print(f"{len(prompts)} held-out prompts, greedy, cap {cfg.generation.max_new_tokens} tokens")
    for name in sides:
        print(f"{name:17s} best {best[name]:6.2f} s  least ${cheapest[name]:.5f}")
    print(
        f"functions / learner's engine: time {functions / learner:.2f}, cost "
        f"{cost_ratio:.2f}; responses the same: "
        f"{same} of {len(records['functions'])}"
    )


if __name__ == "__main__":
    main()
