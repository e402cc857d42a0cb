"""The learning phase's width: how many slots the data-parallel learner takes.

Learning is data parallel with one all-reduce per optimizer step, so W ranks take about 1/W of
the time on W slots: the same slot-seconds, billed per slot, in less wall time. The planner
therefore takes what the step has free once generation is over (the learner's own slot and every
slot the decode functions released), unless told a width, and never more ranks than prompt groups:
the learner splits by group, and a rank with none would be billed for nothing.
"""

from __future__ import annotations

import math


def learner_width(requested: int, free_slots: int, groups: int) -> int:
    """Ranks for the learning phase: `requested` (0: every free slot), within `free_slots` and
    `groups`, at least 1 (the learner's own slot)."""
    want = free_slots if requested == 0 else requested
    return max(1, min(want, free_slots, groups))


def rank_start_delay(predicted_generation_s: float, rank_start_s: float | None) -> float:
    """Seconds after generation starts at which to request the learning phase's extra ranks, so
    their cold start (`rank_start_s`, as last measured: process, model, joining the group) ends
    as generation is forecast to: earlier would bill their slots idle, later makes learning wait.
    Never before a start was measured (`None`): the first phase starts its ranks when it begins."""
    if rank_start_s is None:
        return math.inf
    return max(0.0, predicted_generation_s - rank_start_s)
