"""The learning phase: how many slots the data-parallel learner takes, and when its ranks start.

Learning is data parallel with one gradient sum per optimizer step, so W ranks take about 1/W of
the time on W slots: the same slot-seconds of learning, billed per slot, in less wall time. What
a wider phase adds is its extra ranks' start (process, model, joining the group), billed on their
slots. The width is therefore priced like the decode actors' N (`scaling`): among 1 up to what
the step has free once generation is over (the learner's own slot and every slot the decode
functions released), the lam score of time and cost decides, ties to the narrower. Before a phase
was measured it takes every free slot. Never more ranks than prompt groups: the learner splits by
group, and a rank with none would be billed for nothing.

Warm functions idle in the pool hold slots the phase could take: keep-alive gives way to a
request. A width that needs k of them stops k, which spares their idle bill over the phase and
costs each a cold start at its next use (its billed seconds, and the seconds it adds to that step,
counted in the width's time as `pricing.keep_warm` values them); a width that leaves them warm
pays their idle bill for the phase's time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.migration import ActorProgress
from rlhfless.planner.pricing import charge
from rlhfless.planner.scaling import normalised


@dataclass(frozen=True)
class LearningHistory:
    """What a width is priced from: the last phase's width and learning seconds (its start not
    included), and the longest recent rank start (request to joined)."""

    width: int
    seconds: float
    rank_start_s: float


@dataclass(frozen=True)
class WidthTable:
    """Per candidate width: forecast learning seconds, cost, and the lam score."""

    width: np.ndarray
    time: np.ndarray
    cost: np.ndarray
    score: np.ndarray


def width_table(
    history: LearningHistory,
    most: int,
    scheduler: SchedulerConfig,
    free: int | None = None,
    cold_start_s: float = 0.0,
    exposed: bool = False,
) -> WidthTable:
    """Widths 1..`most`: learning's slot-seconds as last measured, spread evenly (W ranks, 1/W
    of the time each), plus W - 1 rank starts, each on its own slot, priced and scored as the
    scheduler prices and scores actors. Slots past `free` (default: all of `most`) are warm
    functions' that give way: stopped, each a cold start of `cold_start_s` at its next use; kept,
    each billed idle for the phase. `exposed`: the ranks start as the phase opens (not during
    generation's tail), so a wider phase also waits one rank start."""
    pricing, units = scheduler.pricing, float(scheduler.gpus_per_actor)
    free = most if free is None else max(1, min(free, most))
    width = np.arange(1, most + 1)
    work = history.width * history.seconds
    time = work / width
    cost = charge(pricing, units, width * time, cold_s=0.0) + charge(
        pricing, units, (width - 1) * history.rank_start_s, cold_s=(width - 1) * history.rank_start_s
    )
    stopped = np.maximum(width - free, 0)
    kept = (most - free) - stopped
    restart = stopped * cold_start_s
    cost = cost + charge(pricing, units, restart, cold_s=restart, idle_s=kept * time)
    time = time + np.where(stopped > 0, cold_start_s, 0.0)
    if exposed:
        time = time + np.where(width > 1, history.rank_start_s, 0.0)
    lam, how = scheduler.lam, scheduler.normalise
    score = lam * normalised(time, how) + (1.0 - lam) * normalised(cost, how)
    return WidthTable(width, time, cost, score)


def learner_width(
    requested: int,
    free_slots: int,
    groups: int,
    history: LearningHistory | None = None,
    scheduler: SchedulerConfig | None = None,
    warm: int = 0,
    cold_start_s: float = 0.0,
    exposed: bool = False,
) -> int:
    """Ranks for the learning phase: `requested` (0: the planner's choice), within `free_slots`
    plus the `warm` idle functions' slots (they give way), and `groups`, at least 1 (the learner's
    own slot). The planner's choice is every such slot until a phase was measured (`history`),
    then the lam score's first minimum (`width_table`, a warm function's restart taking
    `cold_start_s`, the ranks' start `exposed` or not) under `scheduler`'s lam, normalisation and
    prices."""
    most = max(1, min(free_slots + warm, groups))
    if requested:
        return min(requested, most)
    if history is None or scheduler is None or most == 1:
        return most
    table = width_table(history, most, scheduler, free_slots, cold_start_s, exposed)
    return int(table.width[int(np.argmin(table.score))])


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


def rank_start_estimate(measured: Sequence[float], prior_s: float) -> float | None:
    """A rank's start (request to joined) as the next phase should expect it: the longest of the
    last three measured. Before any, the rank start the step's plan priced stands in
    (`forecast.Calibration.rank_start`: what earlier runs on this machine measured, else a
    function's cold start, which is shorter, so a first phase then waits the difference instead
    of the whole start). None when neither is known."""
    if measured:
        return max(measured[-3:])
    return prior_s if prior_s > 0 else None


def start_ranks_now(left_s: float | None, rank_start_s: float | None) -> bool:
    """Whether to request the learning phase's extra ranks now: once generation's live forecast
    (`generation_left_s`) is within one rank start (`rank_start_s`, `rank_start_estimate`), so
    that they are ready as it ends. Earlier would bill their slots idle, later makes learning
    wait. Never without an estimate (`None`): the phase then starts its ranks when it begins."""
    return left_s is not None and rank_start_s is not None and left_s <= rank_start_s


def start_ranks_ahead(
    left_s: float | None, rank_start_s: float | None, ready_s: float, group_s: float | None
) -> bool:
    """Whether to request the extra ranks now to learn scored groups ahead (`learn_ahead`): once
    the groups scored and waiting (`ready_s` of learning, at the last phase's seconds a token)
    would keep the first rank busy from the end of its start (`rank_start_s`) until generation
    is forecast to end (`left_s`), and the smallest of them (`group_s`) still fits before then.
    Earlier, its slot would be billed idle while it waits for groups: more than the learning it
    takes off the phase saves (on this machine's default run, starting at the first scored group
    cost 12% more a step). Then each group it learns is slot-seconds the phase does not spend, at
    the price it would have had there, and the phase is shorter by its share."""
    if left_s is None or rank_start_s is None or group_s is None:
        return False
    return left_s >= rank_start_s + group_s and ready_s >= left_s - rank_start_s


def learn_ahead_fits(left_s: float | None, queued_s: float, group_s: float | None) -> bool:
    """Whether a started rank takes a scored group now: when its learning, after what the rank
    has queued (`queued_s`: the rest of its start, calls under way), ends before generation is
    forecast to. A call that runs past generation's end delays the phase: the ranks join after it."""
    if left_s is None or group_s is None:
        return False
    return queued_s + group_s <= left_s
