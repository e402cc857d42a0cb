"""A step's plan in its metrics: the plan's figures, its forecast beside what was measured, and its
predicted lengths scored against the step's (which then teach the predictor)."""

from __future__ import annotations

import numpy as np

from rlhfless.planner import LengthPredictor, StepPlan, prediction_quality
from rlhfless.planner.forecast import relative_error
from rlhfless.runtime.samples import Sample, response_lengths


def forecast_metrics(plan: StepPlan, metrics: dict[str, float]) -> dict[str, float]:
    """The plan's forecast beside the measured figures, and its relative error (forecast/actual - 1)."""
    pairs = {
        "generation_time": (plan.predicted_time, metrics.get("time/generation")),
        "generation_cost": (plan.predicted_cost, metrics.get("cost/generation")),
        "step_time": (plan.predicted_step_time, metrics.get("time/step")),
        "step_cost": (plan.predicted_step_cost, metrics.get("cost/step")),
    }
    out: dict[str, float] = {}
    for name, (forecast, actual) in pairs.items():
        out[f"forecast/{name}"] = forecast
        if actual is not None:
            out[f"forecast/error/{name}"] = relative_error(forecast, actual)
    for key, value in plan.target.items():
        out[f"target/{key}"] = value
    return out


def plan_metrics(plan: StepPlan) -> dict[str, float]:
    return {
        "plan/n_actors": float(plan.n_actors),
        "plan/predicted_time": plan.predicted_time,
        "plan/predicted_cost": plan.predicted_cost,
        "plan/prefix_length": float(plan.prefix_length),
        "plan/tree_ratio": float(plan.prefill["tree_ratio"]),
        "plan/learner_width": float(plan.learner_width),  # 0: the learning phase chose its own
        "time/plan": plan.plan_seconds,
    }


def observe_lengths(
    plan: StepPlan, samples: list[Sample], predictor: LengthPredictor, cap: int
) -> dict[str, float]:
    """Score the plan's predictions against this step's lengths, then teach the predictor (`cap`:
    the step's max_new_tokens)."""
    lengths = response_lengths(samples)
    uids = sorted(lengths)
    planned = [plan.predicted_length[u] for u in uids]
    quality = prediction_quality(np.array(planned), np.array([max(lengths[u]) for u in uids]))
    predictor.update_many(uids, [lengths[u] for u in uids], cap, planned)
    return {f"predictor/{k}": v for k, v in quality.items()}
