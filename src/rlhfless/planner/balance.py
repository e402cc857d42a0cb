"""Contiguous assignment over a prompt order: the order, its ranges for every candidate N, and
the chosen N's ranges balanced further.

`sorted` (RLHFless) orders prompts by predicted length; with `backfill` the prompts short enough
to run in several waves on an actor are spread over the order's first part (`backfill_order`),
so that a multi-wave actor holds long and short sequences alike and the short ones fill the slots
the long ones leave. Where that part ends needs the time an actor takes, so the sorted order is
timed first (for the largest N: its actors are the shortest, so the fewest prompts are spread).
`even` (VERL) keeps the input order. Ranges start at equal work (or equal counts) and each
balance round re-splits them to equal predicted time (`retimed_ranges`), all N at once; the
chosen N's ranges then take more rounds alone, which cost little for one N.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from rlhfless.planner.assignment import (
    backfill_order,
    balanced_ranges,
    even_ranges,
    retimed_ranges,
    sorted_order,
)
from rlhfless.planner.profile import Profile
from rlhfless.planner.scaling import ActorEstimates
from rlhfless.planner.timemodel import RangeModel, Workload


@dataclass
class Ranges:
    """Contiguous ranges of one prompt order for every candidate N (ranges of one N consecutive)."""

    order: np.ndarray
    model: RangeModel
    starts: np.ndarray
    ends: np.ndarray
    n_of: np.ndarray


def _split(
    workload: Workload,
    order: np.ndarray,
    ns: np.ndarray,
    profile: Profile,
    segments: int,
    rounds: int,
    by_work: bool,
) -> Ranges:
    if by_work:
        starts, ends, n_of = balanced_ranges(workload.work[order], ns)
    else:
        starts, ends, n_of = even_ranges(workload.size, ns)
    model = RangeModel(workload, order, profile, segments)
    for _ in range(rounds):
        parts = model.times(starts, ends)
        starts, ends, n_of = retimed_ranges(
            model.cum_work, starts, ends, ns, parts["prefill"] + parts["decode"]
        )
    return Ranges(order, model, starts, ends, n_of)


def backfill_threshold(ranges: Ranges, ns: np.ndarray, workload: Workload, profile: Profile) -> float:
    """The predicted length under which a prompt runs in waves: the decode steps the largest N's
    slowest actor takes at its full batch (an actor given longer sequences than that holds
    fewer than its slots)."""
    top = ranges.n_of == ns.max()
    parts = ranges.model.times(ranges.starts[top], ranges.ends[top])
    g = workload.group_size
    mean_prompt = float(workload.prompt_tokens.mean())
    mean_response = float(workload.work.mean()) / g
    cap = float(profile.concurrency(mean_prompt + mean_response))
    step = float(profile.decode_step_seconds(cap, mean_prompt + mean_response / 2))
    return float(np.max(parts["prefill"] + parts["decode"])) / max(step, 1e-12)


def contiguous_ranges(
    workload: Workload,
    ns: np.ndarray,
    profile: Profile,
    segments: int,
    rounds: int,
    sort: bool,
    backfill: bool,
) -> Ranges:
    """The order and every N's ranges: sorted (with `backfill`, its short part spread) or input."""
    if not sort:
        return _split(workload, np.arange(workload.size), ns, profile, segments, rounds, False)
    order = sorted_order(workload.group_max, workload.group_mean)
    ranges = _split(workload, order, ns, profile, segments, rounds, True)
    if not backfill:
        return ranges
    threshold = backfill_threshold(ranges, ns, workload, profile)
    spread = backfill_order(order, workload.group_max, threshold)
    if np.array_equal(spread, order):
        return ranges
    return _split(workload, spread, ns, profile, segments, rounds, True)


def refine(
    ranges: Ranges, actors: ActorEstimates, n: int, rounds: int, estimate: Callable[..., ActorEstimates]
) -> ActorEstimates:
    """`actors` with N = n's ranges re-split to equal predicted time by up to `rounds` more
    rounds (the best round's kept), re-estimated by `estimate(model, starts, ends, n_of)`."""
    rows = np.flatnonzero(actors.n_of == n)
    if rounds < 1 or rows.size < 2:
        return actors
    ns = np.array([n])
    starts, ends = ranges.starts[rows], ranges.ends[rows]
    parts = ranges.model.times(starts, ends)
    busy = parts["prefill"] + parts["decode"]
    best = (float(busy.max()), starts, ends)
    for _ in range(rounds):
        starts, ends, _ = retimed_ranges(ranges.model.cum_work, starts, ends, ns, busy)
        parts = ranges.model.times(starts, ends)
        busy = parts["prefill"] + parts["decode"]
        if busy.max() < best[0]:
            best = (float(busy.max()), starts, ends)
        if busy.max() <= busy.min() * 1.005:
            break
    if best[1] is ranges.starts[rows] or np.array_equal(best[1], ranges.starts[rows]):
        return actors
    mine = estimate(ranges.model, best[1], best[2], np.full(rows.size, n))
    fields = {f: getattr(actors, f).copy() for f in ActorEstimates.__dataclass_fields__}
    for f in fields:
        fields[f][rows] = getattr(mine, f)
    ranges.starts, ranges.ends = ranges.starts.copy(), ranges.ends.copy()
    ranges.starts[rows], ranges.ends[rows] = best[1], best[2]
    return replace(actors, **fields)
