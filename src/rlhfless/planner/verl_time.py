"""What verl would take on the same step, timed by the planner's own model: equal prompt counts in
input order, no prefix sharing. The planner caps actor scaling at it (`scheduler.max_slowdown`),
and the forecast learns how much further short than verl's its plans fall (`forecast.Shortfall`)."""

from __future__ import annotations

import numpy as np

from rlhfless.planner.assignment import even_ranges
from rlhfless.planner.billing import Billing
from rlhfless.planner.profile import Profile
from rlhfless.planner.tail import plan_end
from rlhfless.planner.timemodel import PromptSegments, RangeModel, Workload


def verl_workload(w: Workload) -> Workload:
    """`w` as verl runs it: each sample prefills its whole prompt, and no prefix KV arrives."""
    return Workload(
        w.group_max,
        w.group_mean,
        w.prompt_tokens,
        w.prompt_tokens * w.group_size,
        np.zeros_like(w.prompt_tokens),
        w.group_size,
        w.tail,
        w.tail_below,  # the same predictions and tail: their log F, computed once
    )


def even_split_seconds(
    verl: Workload, n: int, profile: Profile, segments: int, known: PromptSegments | None = None
) -> float:
    """Predicted generation of what verl runs on the same step: equal prompt counts in input order
    over `n` actors (its slowest actor's prefill and decode; the executor's overhead and a first
    step's wait for the learner's decode function are added by the caller, as on every
    candidate). `known`: the same prompts' segments in any order, worked out already."""
    starts, _, _ = even_ranges(verl.size, np.array([n]))
    order = np.arange(verl.size)
    seg = PromptSegments.of(verl, order, segments) if known is None else known.reordered(order)
    blocks = np.arange(starts.size)
    parts = RangeModel.over(verl, seg, profile, starts).times(blocks, blocks + 1)
    end = parts["prefill"] + parts["decode"]
    return plan_end(end, parts)


def verl_cap(
    verl: Workload,
    n: int,
    profile: Profile,
    segments: int,
    max_slowdown: float,
    billing: Billing,
    known: PromptSegments | None = None,
) -> float:
    """The generation time lam's N must be within (`scheduler.max_slowdown`): verl's plan of the
    step on `n` actors of `profile` (verl's own size), with the executor's overhead and a first
    step's wait for the learner's decode function as on every candidate, times `max_slowdown`,
    over how much further short the run's forecasts lately fell than verl's (`known`: as
    `even_split_seconds` takes it)."""
    even = even_split_seconds(verl, n, profile, segments, known)
    return max_slowdown * (even + billing.overhead_s + billing.host_start_s) / billing.generation_shortfall
