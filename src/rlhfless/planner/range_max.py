"""The largest value of any contiguous range of an array, for many ranges at once: each range's
longest predicted group in a prompt order (`timemodel.RangeModel`)."""

from __future__ import annotations

import numpy as np


class RangeMax:
    """Range maxima of `x`. In ascending order (the sorted assignment's) a range's largest value
    is its last; from `rising` on (a backfilled order's sorted rest) that still holds for every
    range ending there, so a sparse table covers only what comes before."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = x
        self.rising = _rising_from(x)
        self.table = _sparse_max(x[: self.rising]) if self.rising else None

    def __call__(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Each range [start, end)'s largest value (0 for a range of nothing)."""
        size = ends - starts
        out = np.where(size > 0, self.x[np.maximum(ends - 1, 0)], 0.0)
        if self.table is None:
            return out
        inside = np.flatnonzero((ends <= self.rising) & (size > 0))
        starts, ends = starts[inside], ends[inside]
        level = np.floor(np.log2(ends - starts)).astype(np.int64)
        row = level * self.table.shape[1]
        table = self.table.ravel()
        low = table.take(row + starts)  # two flat gathers, one per half-range
        np.maximum(low, table.take(row + ends - np.left_shift(1, level)), out=low)
        out[inside] = low
        return out


def _rising_from(x: np.ndarray) -> int:
    """The first index from which `x` never falls and nothing before exceeds: every range that
    ends past it has its largest value last."""
    falls = np.flatnonzero(x[1:] < x[:-1])
    if not falls.size:
        return 0
    start = int(falls[-1]) + 1
    return start + int(np.searchsorted(x[start:], x[:start].max(), side="left"))


def _sparse_max(x: np.ndarray) -> np.ndarray:
    """Row k: the largest of x[i : i + 2**k] at i (valid to i = x.size - 2**k)."""
    table = np.zeros((x.size.bit_length(), x.size))
    table[0] = x
    for k in range(1, table.shape[0]):
        valid, step = x.size - (1 << k) + 1, 1 << (k - 1)
        np.maximum(table[k - 1, :valid], table[k - 1, step : step + valid], out=table[k, :valid])
    return table
