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
from dataclasses import dataclass

import numpy as np

from rlhfless.planner.assignment import (
    backfill_order,
    balanced_ranges,
    even_ranges,
    lpt_ranges,
    retimed_ranges,
    sorted_order,
)
from rlhfless.planner.profile import Profile
from rlhfless.planner.scaling import ActorEstimates
from rlhfless.planner.timemodel import PromptSegments, RangeModel, Workload

DENSE = 24  # candidates all timed before the grid starts
SPREAD = 0.005  # refining stops once the chosen N's actors are predicted this close
STALL = 0.001  # ... or once a round shortens the slowest by less than this
RATIO = 1.08  # the grid's step beyond them
MOVES = 2  # single-prompt moves across the slowest actor's ends, at most, per actor of N
LUMPY = 16  # prompts an actor, at most, where LPT is weighed against the ranges


@dataclass
class Ranges:
    """Contiguous ranges of one prompt order for every candidate N (ranges of one N consecutive)."""

    order: np.ndarray
    model: RangeModel
    starts: np.ndarray
    ends: np.ndarray
    n_of: np.ndarray
    by_work: bool = True  # ranges start at equal work (sorted), else at equal counts (input order)


def _split(
    workload: Workload, model: RangeModel, ns: np.ndarray, rounds: int, by_work: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if by_work:
        starts, ends, n_of = balanced_ranges(workload.work[model.order], ns)
    else:
        starts, ends, n_of = even_ranges(workload.size, ns)
    for _ in range(rounds):
        starts, ends, n_of = retimed_ranges(model.cum_work, starts, ends, ns, _busy(model, starts, ends))
    return starts, ends, n_of


def backfill_threshold(
    workload: Workload, seg: PromptSegments, n: int, rounds: int, profile: Profile
) -> float:
    """The predicted length under which a prompt runs in waves: the decode steps that N = `n`'s
    slowest actor (sorted ranges, `seg`'s order) takes at its full batch (an actor given
    longer sequences than that holds fewer than its slots). One N's ranges are timed as blocks
    (`RangeModel` blocks), each round's, without every prompt's prefix sums."""
    ns = np.array([n])
    cum_work = np.r_[0.0, np.cumsum(seg.work)]
    starts, ends, _ = balanced_ranges(seg.work, ns)
    for left in range(rounds, -1, -1):
        blocks = np.arange(starts.size)
        busy = _busy(RangeModel.over(workload, seg, profile, starts), blocks, blocks + 1)
        if left:
            starts, ends, _ = retimed_ranges(cum_work, starts, ends, ns, busy)
    mean_prompt = float(workload.prompt_tokens.mean())
    mean_response = float(workload.work.mean()) / workload.group_size
    cap = float(profile.concurrency(mean_prompt + mean_response))
    step = float(profile.decode_step_seconds(cap, mean_prompt + mean_response / 2))
    return float(np.max(busy)) / max(step, 1e-12)


def contiguous_ranges(
    workload: Workload,
    ns: np.ndarray,
    profile: Profile,
    segments: int,
    rounds: int,
    sort: bool,
    backfill: bool,
) -> Ranges:
    """The order and every N's ranges: sorted (with `backfill`, its short part spread; where it
    ends is found on the sorted order's largest N alone) or the input order (even counts)."""
    order = sorted_order(workload.group_max, workload.group_mean) if sort else np.arange(workload.size)
    seg = PromptSegments.of(workload, order, segments)
    if sort and backfill:
        threshold = backfill_threshold(workload, seg, int(ns.max()), rounds, profile)
        spread = backfill_order(order, workload.group_max, threshold)
        if not np.array_equal(spread, order):
            order, seg = spread, seg.reordered(spread)
    model = RangeModel.over(workload, seg, profile)
    return Ranges(order, model, *_split(workload, model, ns, rounds, sort), by_work=sort)


def coarse(ns: np.ndarray, dense: int = DENSE, ratio: float = RATIO) -> np.ndarray:
    """The candidate N timed first: every N up to the `dense`-th, then a geometric grid (each
    about `ratio` times the last) to the largest. Time and cost change smoothly with N among
    many actors, so the best N lies between the grid neighbours of the grid's best (`between`)."""
    if ns.size <= dense:
        return ns
    grid = np.unique(
        np.round(ns[dense - 1] * ratio ** np.arange(1, 1 + np.log(ns[-1] / ns[dense - 1]) / np.log(ratio)))
    )
    return np.unique(np.r_[ns[:dense], grid[(grid > ns[dense - 1]) & (grid < ns[-1])], ns[-1]]).astype(
        np.int64
    )


def between(ns: np.ndarray, grid: np.ndarray, n: int) -> np.ndarray:
    """The candidates strictly between the grid neighbours of `n` that the grid skipped."""
    at = int(np.searchsorted(grid, n))
    lo = grid[at - 1] if at > 0 else n
    hi = grid[at + 1] if at + 1 < grid.size else n
    return ns[(ns > lo) & (ns < hi) & ~np.isin(ns, grid)]


def widen(
    ranges: Ranges,
    actors: ActorEstimates,
    ns: np.ndarray,
    rounds: int,
    estimate: Callable[..., ActorEstimates],
) -> tuple[Ranges, ActorEstimates]:
    """`ranges` and `actors` with the candidates `ns` added (every N's rows consecutive, N rising)."""
    model = ranges.model
    starts, ends, n_of = _split(model.workload, model, ns, rounds, ranges.by_work)
    more = estimate(model, starts, ends, n_of)
    by_n = np.argsort(np.r_[actors.n_of, more.n_of], kind="stable")
    merged = ActorEstimates.concat([actors, more]).take(by_n)
    wide = Ranges(ranges.order, model, merged.starts, merged.ends, merged.n_of, ranges.by_work)
    return wide, merged


def refine(
    ranges: Ranges, actors: ActorEstimates, n: int, rounds: int, estimate: Callable[..., ActorEstimates]
) -> ActorEstimates:
    """`actors` with N = n's ranges re-split to equal predicted time by up to `rounds` more
    rounds (the best round's kept), re-estimated by `estimate(model, starts, ends, n_of)`; only
    where some actor runs in waves. A multi-wave actor's time follows its tokens, which the
    predictions get about right; a single-wave actor's follows its longest sequence, which they
    often miss, and balancing harder on it made paper-physical's plans slower (1.36 -> 1.43x the
    floor on GRPO LCB, Qwen2.5-3B, lam 1)."""
    rows = np.flatnonzero(actors.n_of == n)
    if rounds < 1 or rows.size < 2 or not ranges.model.in_waves(actors.starts[rows], actors.ends[rows]).any():
        return actors
    ns = np.array([n])
    starts, ends = ranges.starts[rows], ranges.ends[rows]
    busy = _busy(ranges.model, starts, ends)
    best = (float(busy.max()), starts, ends)
    for _ in range(rounds):
        starts, ends, _ = retimed_ranges(ranges.model.cum_work, starts, ends, ns, busy)
        busy = _busy(ranges.model, starts, ends)
        if busy.max() >= best[0] * (1 - STALL) or busy.max() <= busy.min() * (1 + SPREAD):
            if busy.max() < best[0]:
                best = (float(busy.max()), starts, ends)
            break  # balanced, or a round gained under 0.1%
        best = (float(busy.max()), starts, ends)
    if best[1] is ranges.starts[rows] or np.array_equal(best[1], ranges.starts[rows]):
        return actors
    mine = estimate(ranges.model, best[1], best[2], np.full(rows.size, n))
    ranges.starts, ranges.ends = ranges.starts.copy(), ranges.ends.copy()
    ranges.starts[rows], ranges.ends[rows] = best[1], best[2]
    return actors.put(rows, mine)


def alternatives(
    ranges: Ranges, actors: ActorEstimates, n: int, estimate: Callable[..., ActorEstimates]
) -> list[tuple[ActorEstimates, np.ndarray | None]]:
    """Other assignments of N = n's prompts, each predicted to end sooner than `actors`' own,
    as that N's actor estimates (in `actors`' row order) and their prompt order (None: the
    ranges' own), for the caller to weigh by lam, since either may cost more than it saves.
    - `settle`: the ranges' ends moved a prompt at a time. The share of predicted time that
      `retimed_ranges` cuts at assumes time spread evenly over a range's work; with few prompts an
      actor, each a group of G long samples, the cut overshoots and the rounds stop with one actor
      behind. Where no actor runs in waves `refine` does nothing (a single-wave actor's time
      follows its longest sequence, which predictions miss); a move there is weighed by lam as
      any other, and on paper-physical's GRPO gsm8k it took generation from 1.13x to 1.08x its
      floor, 1.7 points cheaper.
    - LPT (`assignment.lpt_ranges`), where some of N's actors run in waves and all hold `LUMPY`
      prompts or fewer: there the sorted order's last ranges hold only long prompts, whose few
      concurrent sequences (an actor's batch is set by its sequences' mean length) leave those
      actors far behind, while LPT gives each actor long and short prompts alike (A100,
      Llama-2-70B at TP 2, 64 GPQA-like prompts x 16 on 12 actors: 376 s against 155 s for the
      ranges' fastest, from exact lengths; LPT's slowest 304 s). Its Python heap costs about a
      microsecond a prompt."""
    rows = np.flatnonzero(actors.n_of == n)
    if rows.size < 2:
        return []
    model, workload = ranges.model, ranges.model.workload
    starts, ends = actors.starts[rows], actors.ends[rows]
    busy = _busy(model, starts, ends)
    found = []
    settled, settled_busy = settle(model, starts, ends, busy, MOVES * rows.size)
    if settled_busy.max() < busy.max():
        found.append((estimate(model, *settled, np.full(n, n)), None))
    if workload.size <= LUMPY * n and model.in_waves(starts, ends).any():
        order, lpt_starts, lpt_ends = lpt_ranges(workload.work, workload.group_max, n)
        mixed = model.reordered(order)
        if _busy(mixed, lpt_starts, lpt_ends).max() < busy.max():
            found.append((estimate(mixed, lpt_starts, lpt_ends, np.full(n, n)), order))
    return found


def settle(
    model: RangeModel, starts: np.ndarray, ends: np.ndarray, busy: np.ndarray, moves: int
) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """One N's consecutive ranges (starts, ends), and their predicted seconds, after up to
    `moves` single-prompt moves: the slowest actor hands its first prompt to the actor before it,
    or its last to the one after, whichever leaves the two sooner done, while that is sooner than
    it alone now ends."""
    starts, ends, busy = starts.copy(), ends.copy(), busy.copy()
    last = starts.size - 1
    for _ in range(moves):
        i = int(np.argmax(busy))
        if ends[i] - starts[i] < 2:
            break
        # (taker, the cut between it and the slowest moved by one prompt), each pair's two ranges
        pairs = [(j, c) for j, c in ((i - 1, starts[i] + 1), (i + 1, ends[i] - 1)) if 0 <= j <= last]
        lo = np.array([starts[min(i, j)] for j, _ in pairs] + [c for _, c in pairs])
        hi = np.array([c for _, c in pairs] + [ends[max(i, j)] for j, _ in pairs])
        times = _busy(model, lo, hi).reshape(2, -1)
        worse = times.max(axis=0)
        k = int(np.argmin(worse))
        if worse[k] >= busy[i]:
            break
        left, right = min(i, pairs[k][0]), max(i, pairs[k][0])
        ends[left] = starts[right] = pairs[k][1]
        busy[left], busy[right] = times[0, k], times[1, k]
    return (starts, ends), busy


def _busy(model: RangeModel, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Each range's predicted prefill and decode seconds."""
    parts = model.times(starts, ends)
    return parts["prefill"] + parts["decode"]
