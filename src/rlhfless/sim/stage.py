"""Fixed facts of one simulated setup: the model, the decode actor's time table, the cluster and
its prices, and the preparation and learning phases that follow generation on every GPU."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from rlhfless.planner.hardware import ModelShape
from rlhfless.planner.placement import ClusterSpec
from rlhfless.planner.pricing import Pricing
from rlhfless.planner.profile import Profile


@dataclass
class Stage:
    """Fixed facts of the simulated setup that every step uses."""

    model: ModelShape
    profile: Profile  # one decode actor (tp GPUs), the truth the simulator executes
    cluster: ClusterSpec
    total_gpus: int
    pricing: Pricing
    cold_start_s: float
    tflops: float  # peak BF16 per GPU
    learner_mfu: float
    inference_mfu: float
    ppo: bool
    max_response: int | None = None  # the cap on response tokens (unfinished sequences run at most to it)
    # Every decode actor shape rlhfless may plan, by its GPUs (tensor-parallel size), the truth for
    # each; `profile` is one of them (model.tp, verl's and rlhfuse's). Empty: `profile` alone.
    shapes: dict[int, Profile] = field(default_factory=dict)

    def at_shape(self, gpus: int) -> Stage:
        """This stage with decode actors of `gpus` GPUs timed by their own shape's profile."""
        return self if gpus == self.profile.gpus else replace(self, profile=self.shapes[gpus])

    def decode_profiles(self) -> list[Profile]:
        """Every decode actor shape's profile, smallest first."""
        return [self.shapes[g] for g in sorted(self.shapes)] or [self.profile]

    def every_profile(self) -> list[Profile]:
        """The decode shapes and `profile` (the baselines'): each step's floor takes the best of
        them, whichever a policy plans with."""
        return list({p.gpus: p for p in (self.profile, *self.decode_profiles())}.values())

    def phase_seconds(self, tokens: float) -> tuple[float, float]:
        """(preparation, learning) seconds for `tokens` prompt + response tokens on every GPU: the
        reference (and PPO's critic) forward at 2 FLOPs per parameter per token, learning at 6."""
        passes = 2.0 if self.ppo else 1.0  # PPO: the critic is a second model of the same size
        flops = self.total_gpus * self.tflops * 1e12
        work = self.model.params * tokens * passes
        return 2.0 * work / (flops * self.inference_mfu), 6.0 * work / (flops * self.learner_mfu)

    @property
    def after_per_token_s(self) -> float:
        return sum(self.phase_seconds(1.0))
