"""Prompt assignment: which prompts (with all G samples) each of N decode actors gets.

`sorted` (RLHFless) and `even` (VERL) give each actor a contiguous range of one fixed prompt order,
so they return boundaries for many N at once. `lpt` (longest processing time first onto the least
loaded actor) balances predicted work without contiguity; it exists for comparison.
"""

from __future__ import annotations

import heapq

import numpy as np


def sorted_order(group_max: np.ndarray, group_mean: np.ndarray) -> np.ndarray:
    """Prompts by predicted group max, then mean, then input position (deterministic)."""
    return np.lexsort((np.arange(group_max.size), group_mean, group_max))


def _strictly_increasing(cuts: np.ndarray, ns: np.ndarray, total: int) -> np.ndarray:
    """Make each N's interior cuts 1 <= c_1 < ... < c_{N-1} <= total - 1 (no empty actor)."""
    j = np.concatenate([np.arange(1, n) for n in ns]) if ns.size else np.zeros(0, dtype=np.int64)
    n_of = np.repeat(ns, ns - 1)
    group = np.repeat(np.arange(ns.size), ns - 1)
    slack = np.clip(cuts, j, total - n_of + j) - j  # in [0, total - N]
    slack = np.maximum.accumulate(slack + group * total) - group * total
    return slack + j


def _with_ends(cuts: np.ndarray, ns: np.ndarray, total: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, n of each range) for all N, ranges of one N consecutive."""
    parts_s, parts_e = [], []
    pos = 0
    for n in ns:
        inner = cuts[pos : pos + n - 1]
        pos += n - 1
        parts_s.append(np.concatenate(([0], inner)))
        parts_e.append(np.concatenate((inner, [total])))
    starts = np.concatenate(parts_s).astype(np.int64)
    ends = np.concatenate(parts_e).astype(np.int64)
    return starts, ends, np.repeat(ns, ns)


def balanced_ranges(work_in_order: np.ndarray, ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Contiguous split of an ordered list into N ranges of about equal work, for every N in ns."""
    total = work_in_order.size
    cum = np.cumsum(work_in_order)
    targets = np.concatenate([cum[-1] * np.arange(1, n) / n for n in ns]) if total else np.zeros(0)
    cuts = np.searchsorted(cum, targets, side="left") + 1
    return _with_ends(_strictly_increasing(cuts, ns, total), ns, total)


def even_ranges(total: int, ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Equal prompt counts in input order (VERL), for every N in ns."""
    cuts = np.concatenate([np.round(total * np.arange(1, n) / n) for n in ns]).astype(np.int64)
    return _with_ends(_strictly_increasing(cuts, ns, total), ns, total)


def lpt_assign(work: np.ndarray, n: int) -> np.ndarray:
    """Actor index per prompt: heaviest prompt first onto the least loaded actor."""
    heap = [(0.0, i) for i in range(n)]
    actor = np.empty(work.size, dtype=np.int64)
    for p in np.lexsort((np.arange(work.size), -work)):
        load, i = heapq.heappop(heap)
        actor[p] = i
        heapq.heappush(heap, (load + float(work[p]), i))
    return actor
