"""Validation on the Ray executor's decode functions (`validation.engine=functions`): each
validation planned as a step's generation is, from lengths of its own.

The held-out set is the same at every validation, so the lengths one validation measured predict
the next one's, as a prompt's history does in training: greedy responses (the default) run far
shorter than the sampled ones the training predictor learns from (7-23 tokens against estimates
of 100-160 on the default run), and a plan balanced on those put 14 prompts of 140 tokens on one
function and 18 of 531 on the other. A predictor of its own learns them, so that training's
predictions never see a held-out length; the first validation has only training's estimates.
"""

from __future__ import annotations

import copy

from rlhfless.engine import SamplingParams
from rlhfless.planner import LengthPredictor
from rlhfless.runtime.plan_metrics import observe_lengths
from rlhfless.runtime.planning import StepPlanner
from rlhfless.runtime.samples import StepPrompt
from rlhfless.runtime.validation import Decoded


class FunctionsDecode:
    """A `Decode` on the executor's functions: each validation planned for the cluster, the warm
    functions and the learner's still starting one there are then (`StepPlanner.plan_validation`),
    from the held-out set's own lengths (`held_out`, taught by every validation; before the first,
    a copy of `predictor`, training's, which thus records no held-out prompt). `answers`: the
    held-out prompts' answer lengths, the planner's stand-in for lengths never seen. The figures
    add how well the plan predicted (`predictor/...`). Its lengths go into checkpoints
    (`state_dict`), so that a resumed run's next validation is planned from them too."""

    def __init__(
        self, executor, planner: StepPlanner, predictor: LengthPredictor, answers: list[int | None]
    ) -> None:
        self.executor, self.planner, self.predictor, self.answers = executor, planner, predictor, answers
        self.held_out = LengthPredictor.from_config(planner.scheduler)

    def __call__(
        self, prompts: list[StepPrompt], params: SamplingParams, samples: int, stream: int
    ) -> Decoded:
        executor = self.executor
        # Before any held-out length, a copy of training's predictor: it records every prompt it
        # is asked of.
        lengths = self.held_out if self.held_out.observed else copy.deepcopy(self.predictor)
        warm, cluster, starting = executor.warm_functions(), executor.cluster(), executor.host_starting_s()
        plan = self.planner.plan_validation(prompts, self.answers, lengths, samples, warm, cluster, starting)
        decoded = executor.validate(prompts, plan, params, samples, stream)
        decoded.figures |= observe_lengths(plan, decoded.samples, self.held_out, params.max_new_tokens)
        decoded.files["plans"] = plan.to_dict()
        return decoded

    def state_dict(self) -> dict:
        return {"lengths": self.held_out.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.held_out.load_state_dict(state["lengths"])
