"""No simulated generation beats its own floor, under any policy, cluster or length shape."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.sim import experiments
from rlhfless.sim.config import build
from rlhfless.sim.runner import VARIANTS, run_policy


@settings(max_examples=16, deadline=None)
@given(
    gpu=st.sampled_from(["l40s", "h100", "a100"]),
    tp=st.sampled_from([1, 2, 4]),  # 2 and 4: rlhfless may plan smaller decode actors too
    samples=st.integers(4, 16),
    cap=st.sampled_from([1024, 2048, 4096, 8192]),
    dataset=st.sampled_from(["gsm8k", "gpqa", "lcb"]),
    variant=st.sampled_from(["verl", "rlhfless", "rlhfuse", "+assignment", "auto"]),
    max_batch=st.sampled_from([0, 16]),  # 16: actors run in waves (probe admission, backfill)
    nodes=st.sampled_from([1, 2]),  # 2: a step may be split between two decode actor sizes
)
def test_generation_is_never_shorter_than_its_floor(
    gpu, tp, samples, cap, dataset, variant, max_batch, nodes
):
    cfg = build(
        {
            "cluster": {"nodes": nodes, "gpus_per_node": 4, "gpu": gpu},
            "model": {"name": "qwen2.5-3b", "tp": tp, "max_batch": max_batch},
            "workload": {"dataset": dataset, "prompts_per_step": 24, "samples": samples, "max_response": cap},
        }
    )
    overrides = {**VARIANTS["rlhfless"], "migration": "auto"} if variant == "auto" else VARIANTS[variant]
    for step in run_policy(cfg, overrides, 2):
        assert step.generation >= step.floor_time * (1 - 1e-9) > 0
        assert step.cost_generation >= step.floor_cost * (1 - 1e-9)
        assert step.floor_time == max(step.floor_latency, step.floor_throughput)


@pytest.mark.parametrize("dataset", ["gsm8k", "lcb"])
def test_no_variant_beats_verl_by_more_than_the_generation_bound(dataset):
    """The bound is verl's generation over the floors: what a schedule at its floors would give."""
    cfg = build(
        {
            "cluster": {"nodes": 1, "gpus_per_node": 4, "gpu": "h100"},
            "model": {"name": "qwen2.5-3b", "tp": 1},
            "workload": {"dataset": dataset, "prompts_per_step": 24, "samples": 4, "max_response": 2048},
        }
    )
    summary = experiments.summarize(experiments.compare(cfg, ("verl", "rlhfless", "+dedup"), 2))
    verl = summary["verl"]
    for row in summary.values():
        assert row["generation_bound_speedup"] == pytest.approx(verl["generation_over_floor"])
        assert row["generation_bound_cost_reduction"] == pytest.approx(1 - 1 / verl["cost_over_floor"])
        assert row["generation_speedup"] <= row["generation_bound_speedup"] * (1 + 1e-9)
        assert row["generation_cost_reduction"] <= row["generation_bound_cost_reduction"] + 1e-9
