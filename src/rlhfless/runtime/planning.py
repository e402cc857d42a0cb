"""The bridge from a training step to the planner: what this machine is, and the step's plan."""

from __future__ import annotations

import numpy as np

from rlhfless.planner import (
    ClusterSpec,
    LengthPredictor,
    Profile,
    PromptSpec,
    SchedulerConfig,
    StepPlan,
    plan_step,
    prediction_quality,
)
from rlhfless.planner.hardware import GpuSpec, ModelShape, roofline_profile
from rlhfless.runtime.samples import Sample, StepPrompt
from rlhfless.runtime_config import RuntimeConfig

# A 2-core CPU slot as an "accelerator" for the derived default profile: rough peak figures
# (AVX2 FP32 on two cores, one DDR channel's share). Only the ranking of plans depends on it;
# `rlhfless profile` measures the real table.
CPU_SLOT = GpuSpec(
    "cpu-slot",
    bf16_tflops=0.1,
    memory_gb=24,
    memory_tbps=0.02,
    link_gbps=10.0,
    inter_node_gbps=1.0,
    price_per_hour=0.1,
)


def machine_profile(shape: ModelShape, profile_path: str | None) -> Profile:
    """The measured table when given, else one derived from the model's shape on a CPU slot."""
    if profile_path:
        return Profile.load(profile_path)
    return roofline_profile(shape, CPU_SLOT)


def machine_cluster(runtime: RuntimeConfig, gpus_per_actor: int, shape: ModelShape) -> ClusterSpec:
    """One node with the executor's actor slots; transfers sized by the model's weights and KV."""
    return ClusterSpec(
        nodes=1,
        gpus_per_node=runtime.slots() * gpus_per_actor,
        model_bytes=shape.weight_bytes,
        kv_bytes_per_token=shape.kv_bytes_per_token,
    )


class StepPlanner:
    """Calls the planner each step with this run's profile, cluster and settings."""

    def __init__(self, scheduler: SchedulerConfig, profile: Profile, cluster: ClusterSpec, group_size: int):
        self.scheduler, self.profile, self.cluster, self.group_size = scheduler, profile, cluster, group_size

    def plan(
        self, prompts: list[StepPrompt], answer_tokens: list[int | None], predictor: LengthPredictor
    ) -> StepPlan:
        specs = [PromptSpec(p.uid, p.prompt_ids, a) for p, a in zip(prompts, answer_tokens, strict=True)]
        return plan_step(specs, predictor, self.profile, self.cluster, self.scheduler, self.group_size)


def plan_metrics(plan: StepPlan) -> dict[str, float]:
    return {
        "plan/n_actors": float(plan.n_actors),
        "plan/predicted_time": plan.predicted_time,
        "plan/predicted_cost": plan.predicted_cost,
        "plan/prefix_length": float(plan.prefix_length),
        "time/plan": plan.plan_seconds,
    }


def observe_lengths(plan: StepPlan, samples: list[Sample], predictor: LengthPredictor) -> dict[str, float]:
    """Score the plan's predictions against this step's lengths, then teach the predictor."""
    lengths: dict[str, list[int]] = {}
    for s in samples:
        lengths.setdefault(s.uid, []).append(len(s.response_ids))
    uids = sorted(lengths)
    quality = prediction_quality(
        np.array([plan.predicted_length[u] for u in uids]), np.array([max(lengths[u]) for u in uids])
    )
    predictor.update_many(uids, [lengths[u] for u in uids])
    return {f"predictor/{k}": v for k, v in quality.items()}
