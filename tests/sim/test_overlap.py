"""Preparation overlapped with the generation tail: on GPUs the tail frees, nothing trained changes."""

import numpy as np
import pytest

from rlhfless.planner.pricing import Pricing
from rlhfless.sim.config import build
from rlhfless.sim.overlap import FreeGpus, overlap_preparation
from rlhfless.sim.runner import VARIANTS, run_policy


def test_a_group_is_prepared_only_after_it_finished_and_only_on_free_gpus():
    pricing = Pricing(3600.0)  # 1 USD per GPU-second
    # Group 0 finishes at 2 s, group 1 at 9 s; 4 GPUs are free from 4 s, generation ends at 10 s.
    out = overlap_preparation(
        np.array([2.0, 9.0]), np.array([8.0, 8.0]), [FreeGpus(4.0, 4.0, 0.5)], 10.0, pricing
    )
    assert out.done_gpu_s == pytest.approx(8.0 + 4.0)  # group 0 from 4 to 6 s; group 1 from 9 to 10 s
    assert out.left_gpu_s == pytest.approx(4.0)
    assert out.billed == pytest.approx(12.0 + 4 * 0.5)  # the work and the reference weights' load
    nothing = overlap_preparation(np.array([9.5]), np.array([8.0]), [FreeGpus(9.9, 1.0, 0.1)], 9.8, pricing)
    assert nothing.done_gpu_s == 0.0 and nothing.left_gpu_s == 8.0 and nothing.billed == 0.0


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_overlap_shortens_the_step_and_changes_no_generation(algorithm):
    cfg = build(
        {
            "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "l40s"},
            "model": {"name": "qwen2.5-3b", "tp": 1},
            "workload": {"dataset": "gpqa", "prompts_per_step": 64, "samples": 4, "max_response": 2048},
            "training": {"algorithm": algorithm},
        }
    )
    on = run_policy(cfg, {**VARIANTS["rlhfless"], "migration": "gather", "lam": 1.0}, 2)
    off = run_policy(
        cfg, {**VARIANTS["rlhfless"], "migration": "gather", "lam": 1.0, "overlap_preparation": False}, 2
    )
    for a, b in zip(on, off, strict=True):
        assert a.generation == b.generation and a.actors == b.actors and a.learning == b.learning
        assert a.preparation + a.preparation_overlapped == pytest.approx(b.preparation)
        assert b.preparation_overlapped == 0.0
        assert a.time <= b.time and a.time == pytest.approx(b.time - a.preparation_overlapped)
    assert sum(a.preparation_overlapped for a in on) > 0  # the tail freed GPUs, and work ran on them


def test_the_work_overlap_hides_from_the_step_is_still_in_the_next_forecast_of_its_bill():
    """Overlapped preparation leaves the step's time but not its bill: the next plan prices the
    rest of the step by what it was billed, not by what the step waited on (known lengths, so
    that only the phases' rate is forecast)."""
    cfg = build(
        {
            "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "l40s"},
            "model": {"name": "qwen2.5-3b", "tp": 1},
            "workload": {"dataset": "gpqa", "prompts_per_step": 64, "samples": 4, "max_response": 2048},
        }
    )
    steps = run_policy(cfg, {**VARIANTS["rlhfless"], "predictor": "oracle", "lam": 1.0}, 4)
    assert all(r.preparation_overlapped > 0 for r in steps)
    for r in steps[1:]:  # the first plan's rate is the execution's own formula, with nothing hidden
        forecast_after = r.predicted_step_cost - r.predicted_cost
        assert forecast_after == pytest.approx(r.cost_after, rel=0.03)  # 12-20% short if priced as waited
        assert r.predicted_step_cost == pytest.approx(r.cost, rel=0.01)
