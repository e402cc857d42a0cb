"""Build the simulated setup from a SimConfig and run a policy (or an ablation variant) for N steps."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from rlhfless.checks import check
from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.hardware import Roofline, roofline_profile
from rlhfless.planner.predictor import LengthPredictor
from rlhfless.planner.profile import Profile
from rlhfless.sim.config import SimConfig
from rlhfless.sim.step import Simulator, Stage, StepResult
from rlhfless.sim.workload import SyntheticWorkload, TraceWorkload

# Ablation and baseline variants: scheduler overrides on top of the scenario's scheduler section.
VARIANTS: dict[str, dict[str, Any]] = {
    "verl": {"policy": "verl"},
    "+dedup": {
        "policy": "rlhfless",
        "dedup_prefill": True,
        "sorted_assignment": False,
        "actor_scaling": False,
        "cut_and_migrate": False,
        "overlap_preparation": False,
    },
    "+assignment": {  # the paper's PA step: equal-work sorted ranges, its cut-and-migrate rule
        "policy": "rlhfless",
        "dedup_prefill": True,
        "sorted_assignment": True,
        "balance_rounds": 0,
        "backfill": False,
        "longest_first": False,
        "migration": "paper",
        "actor_scaling": False,
        "cut_and_migrate": True,
        "overlap_preparation": False,
    },
    "rlhfless": {"policy": "rlhfless"},  # +scaling: everything on
    "rlhfuse": {"policy": "rlhfuse"},
    "oracle": {"policy": "rlhfless", "predictor": "oracle"},
    "expected": {"policy": "rlhfless", "predictor": "expected"},  # lengths' distribution, not samples
}


def make_stage(cfg: SimConfig) -> Stage:
    shape, spec = cfg.model.shape, cfg.cluster.spec

    def timed(profile: Profile) -> Profile:  # the engine's batch limit on every actor shape
        return replace(profile, max_batch=cfg.model.max_batch) if cfg.model.max_batch else profile

    if cfg.model.profile:
        profile = Profile.load(cfg.model.profile)
        if profile.gpus != cfg.model.tp:
            raise ValueError(
                f"model.tp: got {cfg.model.tp}, expected the measured profile's gpus ({profile.gpus})"
            )
    else:
        check(
            Roofline(shape, spec, cfg.model.tp).kv_bytes > 0,
            "model.tp",
            cfg.model.tp,
            f"enough GPUs to hold {shape.name} ({shape.weight_bytes / 1e9:.1f} GB of weights) on "
            f"{spec.name} ({spec.memory_gb} GB each)",
        )
        profile = roofline_profile(shape, spec, cfg.model.tp)
    profile = timed(profile)
    shapes = {
        tp: profile if tp == profile.gpus else timed(roofline_profile(shape, spec, tp))
        for tp in cfg.decode_sizes()
    }
    return Stage(
        model=shape,
        profile=profile,
        cluster=cfg.cluster.planner_spec(shape),
        total_gpus=cfg.cluster.total_gpus,
        pricing=cfg.cluster.pricing(cfg.scheduler),
        cold_start_s=cfg.cluster.cold_start_s,
        tflops=spec.bf16_tflops,
        learner_mfu=cfg.training.learner_mfu,
        inference_mfu=cfg.training.inference_mfu,
        ppo=cfg.training.algorithm == "ppo",
        max_response=None if cfg.workload.trace else cfg.workload.max_response,  # a trace's cap: unknown
        shapes=shapes,
    )


def make_workload(cfg: SimConfig) -> SyntheticWorkload | TraceWorkload:
    w = cfg.workload
    if w.trace:
        return TraceWorkload(w.trace)
    samples = 1 if cfg.training.algorithm == "ppo" else w.samples
    return SyntheticWorkload(
        w.dataset, w.prompts_per_step, samples, w.max_response, w.max_prompt, w.dataset_size, w.seed
    )


def scheduler_for(cfg: SimConfig, overrides: dict[str, Any]) -> SchedulerConfig:
    """The scenario's scheduler with the actor size and price taken from the modelled cluster. A
    policy of a fixed N (the baselines, and the ablation rows before actor scaling) has nothing for
    lam, a budget or a deadline to choose, so it runs free of the target that rlhfless is held to."""
    base = replace(cfg.scheduler, gpus_per_actor=cfg.model.tp, price_per_gpu_hour=cfg.cluster.price)
    config = replace(base, **overrides)
    if not config.features["actor_scaling"]:
        config = replace(config, budget_per_step=None, deadline_per_step=None)
    return config


def run_policy(
    cfg: SimConfig,
    overrides: dict[str, Any],
    steps: int,
    stage: Stage | None = None,
    workload: SyntheticWorkload | TraceWorkload | None = None,
) -> list[StepResult]:
    """Simulate `steps` steps of one policy from a fresh predictor."""
    stage = stage or make_stage(cfg)
    workload = workload or make_workload(cfg)
    config = scheduler_for(cfg, overrides)
    sim = Simulator(stage, config, LengthPredictor.from_config(config))
    return [sim.run_step(k, workload.step(k)) for k in range(steps)]


def mean_of(results: list[StepResult], key: str) -> float:
    return float(np.mean([getattr(r, key) for r in results]))
