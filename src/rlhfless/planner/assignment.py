"""Prompt assignment: which prompts (with all G samples) each of N decode actors gets.

`sorted` (RLHFless) and `even` (VERL) give each actor a contiguous range of one fixed prompt order,
so they return boundaries for many N at once. `lpt` (longest processing time first onto the least
loaded actor) balances predicted work without contiguity: an assignment method for comparison, and
weighed against the ranges where the chosen N's actors hold few prompts (`balance.alternatives`).
"""

from __future__ import annotations

import heapq

import numpy as np


def sorted_order(group_max: np.ndarray, group_mean: np.ndarray) -> np.ndarray:
    """Prompts by predicted group max, then mean, then input position (deterministic). A
    `lexsort`: float keys of many distinct values rank slower than they sort (`ordering`)."""
    return np.lexsort((group_mean, group_max))  # stable: ties keep input order


GOLDEN = (5**0.5 - 1) / 2


def backfill_order(order: np.ndarray, group_max: np.ndarray, threshold: float) -> np.ndarray:
    """`order` (ascending predicted length) with its prompts of group max <= `threshold` spread
    out: any contiguous run of them samples their whole length range (a golden-ratio
    interleave), so that an actor holding several waves of them gets long and short sequences
    alike and its short ones backfill the slots its long ones leave, instead of a wave of
    similar lengths starting only when the one before it ends."""
    short = int(np.searchsorted(group_max[order], threshold, side="right"))
    if short < 3:
        return order
    spread = np.argsort(np.modf(np.arange(short) * GOLDEN)[0], kind="stable")
    return np.concatenate((order[:short][spread], order[short:]))


def _search(sorted_values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """`np.searchsorted(sorted_values, keys, side="left")`, the keys taken in sorted order: each
    N's cut targets rise, but not across N, and a binary search runs faster over rising keys."""
    by_key = np.argsort(keys)
    found = np.empty(keys.size, dtype=np.intp)
    found[by_key] = np.searchsorted(sorted_values, keys[by_key], side="left")
    return found


def _interior(ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every N in ns, its interior cut numbers j = 1..N-1, with N and the group index of each."""
    n_of = np.repeat(ns, ns - 1)
    group = np.repeat(np.arange(ns.size), ns - 1)
    first = np.repeat(np.cumsum(ns - 1) - (ns - 1), ns - 1)
    return np.arange(n_of.size) - first + 1, n_of, group


def _strictly_increasing(cuts: np.ndarray, ns: np.ndarray, total: int) -> np.ndarray:
    """Make each N's interior cuts 1 <= c_1 < ... < c_{N-1} <= total - 1 (no empty actor)."""
    j, n_of, group = _interior(ns)
    slack = np.clip(cuts, j, total - n_of + j) - j  # in [0, total - N]
    slack = np.maximum.accumulate(slack + group * total) - group * total
    return slack + j


def _with_ends(cuts: np.ndarray, ns: np.ndarray, total: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, n of each range) for all N, ranges of one N consecutive."""
    after = np.cumsum(ns - 1)
    ends = np.insert(cuts, after, total).astype(np.int64)
    starts = np.insert(cuts, after - (ns - 1), 0).astype(np.int64)
    return starts, ends, np.repeat(ns, ns)


def balanced_ranges(work_in_order: np.ndarray, ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Contiguous split of an ordered list into N ranges of about equal work, for every N in ns."""
    total = work_in_order.size
    cum = np.cumsum(work_in_order)
    j, n_of, _ = _interior(ns)
    cuts = _search(cum, cum[-1] * j / n_of) + 1
    return _with_ends(_strictly_increasing(cuts, ns, total), ns, total)


def even_ranges(total: int, ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Equal prompt counts in input order (VERL), for every N in ns."""
    j, n_of, _ = _interior(ns)
    cuts = np.round(total * j / n_of).astype(np.int64)
    return _with_ends(_strictly_increasing(cuts, ns, total), ns, total)


def lpt_ranges(work: np.ndarray, group_max: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LPT (heaviest prompt first onto the least loaded actor) as contiguous ranges of a prompt
    order: the order (actor by actor, each actor's prompts by predicted group max), and each
    actor's [start, end)."""
    heap = [(0.0, i) for i in range(n)]
    actor = np.empty(work.size, dtype=np.int64)
    for p in np.lexsort((np.arange(work.size), -work)):
        load, i = heapq.heappop(heap)
        actor[p] = i
        heapq.heappush(heap, (load + float(work[p]), i))
    bounds = np.r_[0, np.cumsum(np.bincount(actor, minlength=n))]
    return np.lexsort((group_max, actor)), bounds[:-1], bounds[1:]


def retimed_ranges(
    cum_work: np.ndarray, starts: np.ndarray, ends: np.ndarray, ns: np.ndarray, busy: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Contiguous ranges re-split so that every actor of each N gets an equal share of predicted
    time, for every N in ns at once.

    Predicted time is not proportional to work: an actor of long sequences decodes them one step
    per token whatever its batch, so work balance leaves it last. Each range's time is spread over
    its prompts in proportion to their work (the range's seconds per token); the new cuts fall at
    equal shares of that cumulative time. One call is one fixed-point round.

    `cum_work`: prefix sums of work in assignment order (size prompts + 1); ranges of one N
    consecutive (as `balanced_ranges` returns them), `busy` their predicted seconds."""
    total = cum_work.size - 1
    first = np.cumsum(ns) - ns
    busy = np.maximum(busy, 1e-12)
    span = np.add.reduceat(busy, first)
    time_at = np.cumsum(busy) - busy  # every N's ranges laid end to end on one time axis
    j, n_of, group = _interior(ns)
    target = time_at[first[group]] + span[group] * j / n_of
    k = np.clip(np.searchsorted(time_at, target, side="right") - 1, first[group], first[group] + n_of - 1)
    share = np.clip((target - time_at[k]) / busy[k], 0.0, 1.0)
    lo, hi = cum_work[starts[k]], cum_work[ends[k]]
    cuts = _search(cum_work, lo + share * (hi - lo))
    return _with_ends(_strictly_increasing(cuts, ns, total), ns, total)
