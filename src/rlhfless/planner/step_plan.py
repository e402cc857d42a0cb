"""The step plan: what `plan.plan_step` decides for one training step, as the runtime, the
simulator and the report read it (and `plans/step_*.json` holds it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from rlhfless.planner.profile import Profile
from rlhfless.planner.scaling import target_message
from rlhfless.planner.tail import Tail


@dataclass
class PromptSpec:
    """One prompt of the step: its uid (stable across epochs), token ids, and answer length if known."""

    uid: str
    prompt_tokens: Sequence[int] | np.ndarray
    answer_tokens: int | None = None
    source: str = ""  # data source or task: unseen prompts are predicted from their source's lengths


@dataclass
class ActorPlan:
    actor: int
    uids: list[str]
    gpus: int
    gpu_ids: list[int]
    node: int
    predicted_time: float
    predicted_cost: float
    start_delay: float
    hidden: bool
    predicted_tokens: float
    prefill_tokens: float  # prompt tokens this actor computes itself (the rest arrive as prefix KV)
    cold_start: float = 0.0  # seconds of start-up the plan expects (0: a warm or the learner's function)
    keep_warm: bool = True  # after release: stay warm for the next step (idle billed), else stop


@dataclass
class StepPlan:
    """The planner's decision for one step (layout of `plans/step_*.json`)."""

    policy: str
    n_actors: int
    prefix_length: int  # no prompt receives a longer prefix KV (the paper rule's L)
    unique_prefixes: int  # shared prefixes some prompt starts from
    prefix_groups: list[list[str]]  # the uids that start from each, largest group first
    actors: list[ActorPlan]
    candidates: list[dict[str, Any]]
    predicted_time: float
    predicted_cost: float
    prefill: dict[str, Any]
    cut: str
    tau: float
    predicted_length: dict[str, float]
    plan_seconds: float = 0.0
    features: dict[str, Any] = field(default_factory=dict)
    predicted_step_time: float = 0.0  # generation + the forecast rest of the step (`Billing`)
    predicted_step_cost: float = 0.0
    # {"budget_per_step": $} or {"deadline_per_step": s}, and "missed": 1.0 where the plan's
    # forecast is past it (the nearest plan, `target_miss=nearest`), else 0.0
    target: dict[str, float] = field(default_factory=dict)
    keep_unused_warm: bool = True  # warm functions this plan does not use: keep (idle billed) or stop
    # The generation time lam's N had to be within: verl's plan of the step x max_slowdown / the
    # run's shortfall (`forecast.Shortfall`); None where none was computed (lam took the fastest N,
    # a budget or deadline, another policy).
    time_cap: float | None = None
    floor: dict[str, float] = field(default_factory=dict)  # the forecast generation floor (`Floor`)
    # The prefill actor's levels, parents first: {parent, start, end, group} (`Dedup.layout`); a
    # prompt of prefix_groups[g] receives the KV of the path to the node of group g (less its
    # own last token, which it computes).
    prefix_tree: list[dict[str, int]] = field(default_factory=list)
    # The (calibrated) time table this plan was made with: the executor's migration decisions read
    # it, as the simulator's do. Not part of `to_dict`: the run's profile file holds it.
    profile: Profile | None = field(default=None, repr=False, compare=False)
    # verl's plan of the same step that capped this one (its actor count; 0: none did), and the
    # group means predicted (input order, as `predicted_length`), so that the run can learn how far
    # its forecasts fall short against verl's (`replay.versus_verl`). Not part of `to_dict`.
    verl_actors: int = field(default=0, compare=False)
    predicted_mean: np.ndarray | None = field(default=None, repr=False, compare=False)
    # The learning phase's width a budget or deadline chose with N (0: the phase chooses by lam),
    # and every pair of N and width it chose among: {n, width, step_time, step_cost} (none where
    # the executor offers one width).
    learner_width: int = 0
    # A learner rank's start as this plan priced it (`Billing.rank_start_s`): what the runtime
    # expects before it has measured one (0: ranks live across steps, or none priced).
    rank_start_s: float = field(default=0.0, compare=False)
    step_options: list[dict[str, float]] = field(default_factory=list)
    # Each decode actor size's plan (and a split's) where several were weighed (`planner.sizes`)
    shape_options: list[dict[str, Any]] = field(default_factory=list)
    # A split between two sizes (`planner.pools`): each part's plan, not part of `to_dict`
    pools: list[StepPlan] = field(default_factory=list, repr=False, compare=False)
    # Where a split was weighed: the best split and the best single size, so that the run learns
    # how much further short the split's forecast falls (`replay.versus_single`); not in `to_dict`
    split_versus: tuple[StepPlan, StepPlan] | None = field(default=None, repr=False, compare=False)
    # The last step's samples over their group's planned max, as ratios (`LengthPredictor.overrun`):
    # how far a sequence that outlived its prediction is expected to run on (`remaining_tokens`)
    overrun: list[float] = field(default_factory=list)
    # How far the run's group maxima outran their predictions, as this plan was timed with it
    # (`tail.Tail`), so that its replays at the predicted lengths time it so; not in `to_dict`
    tail: Tail | None = field(default=None, repr=False, compare=False)

    def missed_target(self) -> str | None:
        """One line naming the budget or deadline this plan's forecast is past, and the plan."""
        if not self.target.get("missed"):
            return None
        key = "budget_per_step" if "budget_per_step" in self.target else "deadline_per_step"
        least = self.predicted_step_cost if key == "budget_per_step" else self.predicted_step_time
        return target_message(key, self.target[key], least, self.n_actors)

    def actor_of(self) -> dict[str, int]:
        """uid -> actor index."""
        return {uid: a.actor for a in self.actors for uid in a.uids}

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "features": self.features,
            "n_actors": self.n_actors,
            "prefix_length": self.prefix_length,
            "unique_prefixes": self.unique_prefixes,
            "prefix_groups": self.prefix_groups,
            "prefix_tree": self.prefix_tree,
            "actors": [asdict(a) for a in self.actors],
            "candidates": self.candidates,
            "predicted_time": self.predicted_time,
            "predicted_cost": self.predicted_cost,
            "prefill": self.prefill,
            "cut": self.cut,
            "tau": self.tau,
            "predicted_length": self.predicted_length,
            "plan_seconds": self.plan_seconds,
            "predicted_step_time": self.predicted_step_time,
            "predicted_step_cost": self.predicted_step_cost,
            "target": self.target,
            "keep_unused_warm": self.keep_unused_warm,
            "time_cap": self.time_cap,
            "floor": self.floor,
            "learner_width": self.learner_width,
            "step_options": self.step_options,
            "shape_options": self.shape_options,
            "overrun": self.overrun,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepPlan:
        """Read back `to_dict` (a run's `plans/step_*.json`), e.g. to replay it in the simulator."""
        return cls(**{**data, "actors": [ActorPlan(**a) for a in data["actors"]]})

    def prefix_tokens(self, uids: Sequence[str], lengths: np.ndarray) -> np.ndarray:
        """Prompt tokens each of `uids` (of `lengths` tokens) receives as prefix KV."""
        if not self.features.get("dedup_prefill"):
            return np.zeros(len(uids), dtype=np.int64)
        if not self.prefix_tree:  # a plan written before the tree: every group's prefix is L long
            return np.minimum(np.maximum(np.asarray(lengths) - 1, 0), self.prefix_length)
        node_end = {}
        for node in self.prefix_tree:
            if node["group"] >= 0:
                node_end.update(dict.fromkeys(self.prefix_groups[node["group"]], node["end"]))
        ends = np.fromiter((node_end.get(u, 0) for u in uids), dtype=np.int64, count=len(uids))
        return np.minimum(ends, np.maximum(np.asarray(lengths) - 1, 0))
