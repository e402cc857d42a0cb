"""The paper's experiments on the simulator: policy comparison, ablation, sweeps, scalability."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from rlhfless.sim.config import SimConfig
from rlhfless.sim.runner import VARIANTS, make_stage, make_workload, mean_of, run_policy
from rlhfless.sim.step import StepResult

ABLATION = ("verl", "+dedup", "+assignment", "rlhfless")
TAUS = (0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
LAMS = (0.0, 0.25, 0.5, 0.7, 1.0)
WINDOWS = (1, 2, 4, 8)
NOISES = (0.0, 0.25, 0.5, 1.0)
NODES = (1, 2, 5, 10, 20)


def summarize(results: dict[str, list[StepResult]]) -> dict[str, dict[str, float]]:
    """Per variant: mean step time and cost, generation time and cost over their floors, and
    speedup / cost reduction against verl for the whole step, for the generation phase alone, and
    the bounds a schedule can reach: the whole step with generation at its floor, and generation
    itself at its floors (time, and work for cost), against verl's generation."""
    base = results.get("verl")
    out = {}
    for name, steps in results.items():
        row = {
            "mean_step_time": mean_of(steps, "time"),
            "mean_generation_time": mean_of(steps, "generation"),
            "mean_cost": mean_of(steps, "cost"),
            "mean_generation_cost": mean_of(steps, "cost_generation"),
            "mean_actors": mean_of(steps, "n_actors"),
            "mean_actor_gpus": mean_of(steps, "actor_gpus"),  # each decode actor's TP size
            "mean_migrations": mean_of(steps, "migrations"),
            "mean_plan_seconds": mean_of(steps, "plan_seconds"),
            "mean_floor_time": mean_of(steps, "floor_time"),
            "mean_floor_latency": mean_of(steps, "floor_latency"),
            "mean_floor_throughput": mean_of(steps, "floor_throughput"),
            "mean_floor_cost": mean_of(steps, "floor_cost"),
            # prompt tokens computed over the prefix tree's unique ones (1.0 is the least)
            "prefill_tree_ratio": sum(r.prefill_tokens for r in steps) / sum(r.prefill_unique for r in steps),
            # the length pilot before the first step, outside every step's figures
            "pilot_prompts": float(sum(r.pilot_prompts for r in steps)),
            "pilot_seconds": sum(r.pilot_seconds for r in steps),
            "pilot_cost": sum(r.pilot_cost for r in steps),
        }
        row["generation_over_floor"] = row["mean_generation_time"] / row["mean_floor_time"]
        row["cost_over_floor"] = row["mean_generation_cost"] / row["mean_floor_cost"]
        if base:
            row["speedup"] = mean_of(base, "time") / row["mean_step_time"]
            row["cost_reduction"] = 1.0 - row["mean_cost"] / mean_of(base, "cost")
            row["generation_speedup"] = mean_of(base, "generation") / row["mean_generation_time"]
            row["generation_cost_reduction"] = 1.0 - row["mean_generation_cost"] / mean_of(
                base, "cost_generation"
            )
            # The whole-step bound: this variant's step with its generation at the floor.
            after = row["mean_step_time"] - row["mean_generation_time"]
            row["bound_speedup"] = mean_of(base, "time") / (row["mean_floor_time"] + after)
            row["bound_cost_reduction"] = 1.0 - (row["mean_floor_cost"] + mean_of(steps, "cost_after")) / (
                mean_of(base, "cost")
            )
            # The generation bound: what no schedule's generation beats, against verl's.
            row["generation_bound_speedup"] = mean_of(base, "generation") / row["mean_floor_time"]
            row["generation_bound_cost_reduction"] = 1.0 - row["mean_floor_cost"] / mean_of(
                base, "cost_generation"
            )
        out[name] = row
    return out


def compare(cfg: SimConfig, variants: tuple[str, ...], steps: int) -> dict[str, list[StepResult]]:
    """Run each named variant on the same workload from a fresh predictor."""
    stage = make_stage(cfg)
    return {name: run_policy(cfg, VARIANTS[name], steps, stage, make_workload(cfg)) for name in variants}


def sweep(cfg: SimConfig, base: str, key: str, values: tuple[Any, ...], steps: int) -> list[dict[str, float]]:
    """Mean time and cost of `base` with scheduler `key` set to each value."""
    stage = make_stage(cfg)
    rows = []
    for value in values:
        overrides = {**VARIANTS[base], key: value}
        if key == "noise":
            overrides["predictor"] = "noisy"
        if key == "lam":  # the paper's trade-off: lam over every N, none capped at verl's time
            overrides["max_slowdown"] = None
        res = run_policy(cfg, overrides, steps, stage, make_workload(cfg))
        rows.append(
            {
                "value": value,
                "time": mean_of(res, "time"),
                "cost": mean_of(res, "cost"),
                "generation": mean_of(res, "generation"),
            }
        )
    return rows


def actor_sweep(cfg: SimConfig, steps: int) -> list[dict[str, float]]:
    """Fixed actor counts (scaling off) with RLHFless's assignment: the sweet-spot curve."""
    most = cfg.cluster.total_gpus // cfg.model.tp
    counts = sorted({max(1, round(most * f)) for f in (0.125, 0.25, 0.375, 0.5, 0.75, 1.0)})
    stage = make_stage(cfg)
    rows = []
    for n in counts:
        overrides = {**VARIANTS["rlhfless"], "actor_scaling": False, "n_min": 1, "n_max": n}
        res = run_policy(cfg, overrides, steps, stage, make_workload(cfg))
        rows.append(
            {
                "value": n,
                "time": mean_of(res, "time"),
                "cost": mean_of(res, "cost"),
                "generation": mean_of(res, "generation"),
            }
        )
    return rows


def scalability(cfg: SimConfig, steps: int, nodes: tuple[int, ...] = NODES) -> list[dict[str, float]]:
    """Cluster size from 1 to 20 nodes: step time, cost, speedup, and the planner's own time."""
    rows = []
    for n in nodes:
        scaled = replace(cfg, cluster=replace(cfg.cluster, nodes=n))
        res = compare(scaled, ("verl", "rlhfless"), steps)
        summary = summarize(res)["rlhfless"]
        rows.append(
            {
                "value": n,
                "time": summary["mean_step_time"],
                "cost": summary["mean_cost"],
                "speedup": summary["speedup"],
                "cost_reduction": summary["cost_reduction"],
                "plan_ms": 1e3 * float(np.mean([r.plan_seconds for r in res["rlhfless"]])),
            }
        )
    return rows
