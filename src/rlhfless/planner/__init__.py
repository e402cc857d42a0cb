"""Every RLHFless scheduling decision, pure Python + numpy: the runtime and the simulator share it."""

from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.migration import ActorProgress, Migration, decide
from rlhfless.planner.placement import ClusterSpec
from rlhfless.planner.plan import plan_step
from rlhfless.planner.prediction_quality import prediction_quality
from rlhfless.planner.predictor import LengthPredictor
from rlhfless.planner.profile import Profile
from rlhfless.planner.step_plan import PromptSpec, StepPlan

__all__ = [
    "ActorProgress",
    "ClusterSpec",
    "LengthPredictor",
    "Migration",
    "Profile",
    "PromptSpec",
    "SchedulerConfig",
    "StepPlan",
    "decide",
    "plan_step",
    "prediction_quality",
]
