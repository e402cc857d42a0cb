"""The planner's decisions on seeded workloads are the ones recorded before its speed-ups.

`data/recorded_plans.json` holds, per case, the whole plan (`StepPlan.to_dict` less its
`plan_seconds`) that commit 6a509e5 made, re-recorded when the prefix tree became the default
dedup rule (its plans compute fewer prompt tokens), when the time model's second wave learned
where its K-th longest sequence ends, when verl's ranges were summed once each instead of
differenced from prefix sums (its time cap moved by one unit in the last place), and when the
chosen N's ranges were settled a prompt at a time (`balance.settle`: `fixed_n` 0.25% sooner done
at the same cost). Speed work must leave every decision, figure and rounding as it was.
Workloads come from `random.Random(seed).random()` alone, whose stream Python keeps across
versions. A change meant to change plans records them anew:
`PYTHONPATH=src python tests/planner/test_planner_recorded.py`.
"""

import json
import random
from pathlib import Path

import numpy as np
import pytest

from rlhfless.planner.billing import Billing
from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.hardware import ModelShape, roofline_profile
from rlhfless.planner.placement import ClusterSpec
from rlhfless.planner.plan import plan_step
from rlhfless.planner.predictor import LengthPredictor
from rlhfless.planner.profile import Profile
from rlhfless.planner.step_plan import PromptSpec

RECORDED = Path(__file__).parent / "data" / "recorded_plans.json"


def workload(seed: int, group_size: int) -> tuple[list[PromptSpec], LengthPredictor]:
    """Prompts with a shared system prompt (or none), duplicates, ends inside the first chunk,
    lists and arrays of tokens, answers, sources; about half of them seen before."""
    rnd = random.Random(seed)

    def pick(k: int) -> int:
        return int(rnd.random() * k)

    vocab = (3, 50_000, 2**32 - 2)[pick(3)]
    system = [pick(vocab) for _ in range((0, 60, 70)[pick(3)])]
    prompts, predictor = [], LengthPredictor(window=1 + 2 * pick(2))
    for i in range(40 + pick(160)):
        if prompts and rnd.random() < 0.1:
            tokens = list(prompts[pick(len(prompts))].prompt_tokens)
        else:
            tokens = system + [pick(vocab) for _ in range(1 + pick(40))]
        if rnd.random() < 0.5:
            tokens = np.array(tokens, dtype=np.int64)
        answer = 1 + pick(500) if rnd.random() < 0.7 else None
        prompts.append(PromptSpec(f"p{i}", tokens, answer, ("", "a", "b")[pick(3)]))
        if rnd.random() < 0.5:
            predictor.update(f"p{i}", [1 + int(3000 * rnd.random() ** 3) for _ in range(group_size)])
    return prompts, predictor


def measured_like() -> Profile:
    """A small measured-looking table: an engine batch limit, a cold start, few grid points."""
    batch, context = np.array([1.0, 8.0, 64.0, 256.0]), np.array([0.0, 700.0, 3000.0, 9000.0])
    ms = 8.0 + 0.05 * batch[:, None] + 0.002 * context[None, :] * np.sqrt(batch[:, None])
    return Profile(
        np.array([1.0, 512.0, 4096.0]),
        np.array([2.0, 20.0, 160.0]),
        batch,
        context,
        ms,
        max_kv_tokens=200_000,
        cold_start_s=5.0,
        max_batch=128,
    )


CASES = {
    "default": (1, 8, {}),
    "paper_rule": (1, 8, {"prefix_rule": "paper"}),  # the default's workload, the paper's D(L) rule
    "verl": (1, 8, {"policy": "verl"}),
    "group_of_one": (2, 1, {}),
    "rlhfuse": (9, 8, {"policy": "rlhfuse"}),
    "two_rounds_range": (3, 4, {"balance_rounds": 2, "normalise": "range", "lam": 0.3}),
    "lpt": (4, 4, {"assignment_method": "lpt", "longest_first": False}),
    "no_dedup_even": (5, 2, {"dedup_prefill": False, "sorted_assignment": False}),
    "budget": (6, 8, {"budget_per_step": 0.05, "prefill_capacity": 2}),
    "deadline_measured": (7, 8, {"deadline_per_step": 500.0, "segments": 5}),
    "fixed_n": (8, 8, {"actor_scaling": False, "bill_keep_alive": False}),
}


def plan_case(name: str) -> dict:
    seed, group_size, overrides = CASES[name]
    prompts, predictor = workload(seed, group_size)
    config = SchedulerConfig(**overrides)
    if name == "deadline_measured":
        profile = measured_like()
    else:
        profile = roofline_profile(ModelShape.resolve("llama-2-7b"), "h100", 1)
    cluster = ClusterSpec(
        node_gpus=(4, 3, 8) if seed % 2 else (),
        nodes=2,
        gpus_per_node=8,
        model_bytes=13 * 10**9,
        kv_bytes_per_token=500_000,
    )
    billing = (
        Billing(config.pricing, resident_units=1.0, warm_actors=2, after_fixed_s=3.0, after_units=1.0)
        if seed % 3 == 0
        else None
    )
    plan = plan_step(prompts, predictor, profile, cluster, config, group_size, billing, 2048.0)
    recorded = plan.to_dict()
    del recorded["plan_seconds"]
    return recorded


@pytest.mark.parametrize("name", sorted(CASES))
def test_plans_are_the_recorded_ones(name):
    recorded = json.loads(RECORDED.read_text())[name]
    got = json.loads(json.dumps(plan_case(name)))
    for key in recorded:  # one key at a time, so that a failure names what moved
        assert got[key] == recorded[key], key
    assert got.keys() == recorded.keys()


if __name__ == "__main__":
    RECORDED.write_text(json.dumps({n: plan_case(n) for n in sorted(CASES)}, sort_keys=True) + "\n")
