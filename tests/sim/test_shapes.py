"""The simulator's decode actor shapes: rlhfless decodes at the tensor-parallel size its plan
took, the baselines at model.tp, and every policy's floor is the best of all the shapes."""

import re

import pytest

from rlhfless.planner.billing import handback
from rlhfless.planner.forecast import SPLIT_PRIOR
from rlhfless.planner.hardware import GpuSpec, ModelShape, Roofline, decode_sizes
from rlhfless.planner.plan import plan_step
from rlhfless.planner.pools import split_plans
from rlhfless.planner.predictor import LengthPredictor
from rlhfless.planner.pricing import charge
from rlhfless.planner.scaling import PlanError
from rlhfless.planner.step_plan import PromptSpec
from rlhfless.sim.config import build
from rlhfless.sim.runner import VARIANTS, make_stage, make_workload, run_policy, scheduler_for
from rlhfless.sim.step import Simulator


def scenario(**model):
    return build(
        {
            "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "l40s"},
            "model": {"name": "qwen2.5-7b", "tp": 4, **model},
            "workload": {"dataset": "gpqa", "prompts_per_step": 32, "samples": 4, "max_response": 2048},
        }
    )


@pytest.mark.parametrize(("model", "gpu", "largest"), [("llama-2-70b", "h100", 8), ("qwen2.5-7b", "l40s", 4)])
def test_default_sizes_are_the_powers_of_two_whose_gpus_keep_as_much_memory_for_kv_as_for_weights(
    model, gpu, largest
):
    shape = ModelShape.resolve(model)
    sizes = decode_sizes(model, gpu, largest)
    assert sizes[-1] == largest
    for tp in (1, 2, 4):
        if tp < largest:
            keeps = Roofline(shape, GpuSpec.resolve(gpu), tp).kv_bytes >= shape.weight_bytes / tp
            assert (tp in sizes) == keeps
    assert decode_sizes("llama-2-70b", "h100", 8) == [4, 8]


def test_rlhfless_decodes_at_the_shape_its_plan_took_the_baselines_at_model_tp():
    cfg = scenario(decode_tp=[1, 4])
    stage = make_stage(cfg)
    assert sorted(stage.shapes) == [1, 4]
    ours = run_policy(cfg, VARIANTS["rlhfless"], 2, stage)
    verl = run_policy(cfg, VARIANTS["verl"], 2, stage)
    for mine, theirs in zip(ours, verl, strict=True):
        assert mine.actor_gpus in (1, 4)
        assert {a["gpus"] for a in mine.actors} == {mine.actor_gpus}
        assert theirs.actor_gpus == 4
        assert mine.floor_time == theirs.floor_time  # one floor a step, whichever policy
    only_one = run_policy(scenario(decode_tp=[1]), VARIANTS["rlhfless"], 1)
    assert only_one[0].actor_gpus == 1


def test_the_floor_over_shapes_takes_each_bound_from_the_shape_best_at_it():
    alone = {tp: run_policy(scenario(tp=tp, decode_tp=[tp]), VARIANTS["verl"], 1)[0] for tp in (1, 4)}
    both = run_policy(scenario(decode_tp=[1, 4]), VARIANTS["verl"], 1)[0]
    assert alone[1].floor_time != alone[4].floor_time
    assert both.floor_latency == min(step.floor_latency for step in alone.values())
    assert both.floor_throughput == min(step.floor_throughput for step in alone.values())


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"decode_tp": [3]}, "model.decode_tp: got [3], expected divisors of cluster.gpus_per_node (8)"),
        ({"decode_tp": [0]}, "model.decode_tp: got [0], expected integers >= 1"),
        (
            {"decode_tp": [2, 4], "profile": "measured.json"},
            "model.decode_tp: got [2, 4], expected only model.tp (4) with a measured model.profile",
        ),
    ],
)
def test_a_decode_size_the_cluster_or_profile_cannot_time_is_one_line_naming_it(model, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        scenario(**model)


def test_a_split_plan_generates_each_part_at_its_own_size_as_that_part_alone_would():
    cfg = build(
        {
            "cluster": {"nodes": 2, "gpus_per_node": 8, "gpu": "l40s"},
            "model": {"name": "qwen2.5-7b", "tp": 4, "decode_tp": [1, 4]},
            "workload": {"dataset": "lcb", "prompts_per_step": 64, "samples": 4, "max_response": 4096},
        }
    )
    stage = make_stage(cfg)
    config = scheduler_for(cfg, VARIANTS["rlhfless"])
    sim = Simulator(stage, config, LengthPredictor.from_config(config))
    step = make_workload(cfg).step(0)
    specs = [PromptSpec(u, t) for u, t in zip(step.uids, step.prompt_tokens, strict=True)]
    gmax, _ = sim.predictor.predict(step.uids)
    one, four = sim.planner_profiles

    def part(subset, profile, nodes, c):
        return plan_step(
            subset, sim.predictor, profile, nodes, c, 4, sim.billing(), 4096, sim.planner_profiles
        )

    whole = part(specs, four, stage.cluster, config)
    plan = split_plans(specs, gmax, four, one, stage.cluster, config, 4, sim.billing(), whole, part)[0]
    whole = sim.execute(0, step, plan)
    parts = [sim.execute(0, step.subset(p.predicted_length), p) for p in plan.pools]
    assert sorted({a["gpus"] for a in whole.actors}) == [1, 4]
    assert whole.actors == [a for p in parts for a in p.actors]
    assert whole.generation == max(p.generation for p in parts)
    # Each actor's GPUs go back to the learner at the later part's end: the bill is each
    # function's own, then its hand-back to that end, then the GPUs no part took.
    own = sum(
        charge(stage.pricing, a["gpus"], a["released"])
        + handback(stage.pricing, a["gpus"], whole.generation - a["released"], a["warm"], stage.cold_start_s)
        for a in whole.actors
    )
    assert whole.untaken_gpus == stage.total_gpus - sum(a["gpus"] for a in whole.actors)
    untaken = handback(
        stage.pricing, whole.untaken_gpus, whole.generation, whole.untaken_warm, stage.cold_start_s
    )
    assert whole.cost_generation == pytest.approx(own + untaken)
    assert whole.tokens == pytest.approx(sum(p.tokens for p in parts))


def test_a_budget_or_deadline_holds_rlhfless_and_leaves_the_fixed_policies_as_they_run():
    cfg = build(
        {
            "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "l40s"},
            "model": {"name": "qwen2.5-7b", "tp": 4},
            "workload": {"dataset": "gpqa", "prompts_per_step": 32, "samples": 4, "max_response": 2048},
            "scheduler": {"deadline_per_step": 1e-3},  # no plan meets it
        }
    )
    for name in ("verl", "rlhfuse", "+dedup", "+assignment"):  # a fixed N: nothing to choose
        config = scheduler_for(cfg, VARIANTS[name])
        assert config.deadline_per_step is None and config.budget_per_step is None
        assert run_policy(cfg, VARIANTS[name], 1)[0].time > 1e-3
    assert scheduler_for(cfg, VARIANTS["rlhfless"]).deadline_per_step == 1e-3
    with pytest.raises(PlanError, match="deadline_per_step: got 0.001 s"):
        run_policy(cfg, VARIANTS["rlhfless"], 1)


def test_a_run_weighing_splits_learns_from_every_step_how_far_they_fell_short_of_a_single_size():
    """Each step where a split was weighed replays it and the best single size at the step's own
    lengths (`replay.versus_single`), the first step's too; the next plan weighs splits
    stretched by what was learned (before any, by `SPLIT_PRIOR`)."""
    cfg = build(
        {
            "cluster": {"nodes": 4, "gpus_per_node": 8, "gpu": "h100"},
            "model": {"name": "qwen2.5-7b", "tp": 2},
            "workload": {
                "dataset": "gsm8k",
                "prompts_per_step": 64,
                "samples": 8,
                "max_response": 8192,
                "seed": 7,
            },
        }
    )
    stage = make_stage(cfg)
    config = scheduler_for(cfg, VARIANTS["rlhfless"])
    sim = Simulator(stage, config, LengthPredictor.from_config(config))
    assert sim.billing().split_shortfall == SPLIT_PRIOR
    workload = make_workload(cfg)
    for k in range(3):
        sim.run_step(k, workload.step(k))
    assert sim.split_shortfall.quotients and len(sim.split_shortfall.quotients) == 3
    assert sim.billing().split_shortfall == sim.split_shortfall.factor() != SPLIT_PRIOR


def test_a_model_too_large_for_its_tensor_parallel_size_is_one_line_naming_model_tp():
    cfg = build({"cluster": {"gpu": "h100"}, "model": {"name": "llama-2-70b", "tp": 1}})
    expected = "model.tp: got 1, expected enough GPUs to hold llama-2-70b (138.0 GB of weights) on h100"
    with pytest.raises(ValueError, match=re.escape(expected)):
        make_stage(cfg)
