"""The learning phase: how many slots the data-parallel learner takes, and when its ranks start.

Learning is data parallel with one all-reduce per optimizer step, so W ranks take about 1/W of
the time on W slots: the same slot-seconds, billed per slot, in less wall time. The planner
therefore takes what the step has free once generation is over (the learner's own slot and every
slot the decode functions released), unless told a width, and never more ranks than prompt groups:
the learner splits by group, and a rank with none would be billed for nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rlhfless.planner.migration import ActorProgress


def learner_width(requested: int, free_slots: int, groups: int) -> int:
    """Ranks for the learning phase: `requested` (0: every free slot), within `free_slots` and
    `groups`, at least 1 (the learner's own slot)."""
    want = free_slots if requested == 0 else requested
    return max(1, min(want, free_slots, groups))


def generation_left_s(actors: Sequence[ActorProgress], token_s: Mapping[int, float]) -> float | None:
    """Seconds until generation is forecast to end, from where it stands now: each live actor's
    longest remaining sequence (predicted tokens left, as the migration rule sees them) at the
    seconds per token (one decode iteration) its last report measured. None while a live actor
    with sequences left has not measured one yet."""
    left = 0.0
    for a in actors:
        if not a.running or not a.remaining:
            continue
        if a.actor not in token_s:
            return None
        left = max(left, max(a.remaining.values()) * token_s[a.actor])
    return left


def start_ranks_now(left_s: float | None, rank_start_s: float | None) -> bool:
    """Whether to request the learning phase's extra ranks now: once generation's live forecast
    (`generation_left_s`) is within one rank start (`rank_start_s`, as last measured: process,
    model, joining the group), so that they are ready as it ends. Earlier would bill their slots
    idle, later makes learning wait. Never before a start was measured (`None`): the first phase
    starts its ranks when it begins."""
    return left_s is not None and rank_start_s is not None and left_s <= rank_start_s
