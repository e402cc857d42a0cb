"""Stable lexicographic orders from unstable sorts, which numpy runs several times faster.

Each key is replaced by its dense rank (equal values, equal ranks) and the ranks and the row
position are packed into one uint64: the packed values are distinct, so any sort puts them in
the order a stable sort of the keys would. Keys whose ranks do not fit 64 bits go to `lexsort`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def lex_order(keys: Sequence[np.ndarray]) -> np.ndarray:
    """`np.lexsort(keys)`: rows by the last key, ties by the one before, ..., then by position.
    One key needs no ranks: a stable sort of it is as fast as the ranking alone."""
    if len(keys) == 1:
        return np.argsort(keys[0], kind="stable")
    rows = len(keys[0])
    packed = np.arange(rows, dtype=np.uint64)
    used = max(rows - 1, 0).bit_length()
    for key in keys:
        values, rank = np.unique(key, return_inverse=True)
        bits = max(values.size - 1, 0).bit_length()
        if used + bits > 64:
            return np.lexsort(keys)
        packed |= rank.astype(np.uint64) << np.uint64(used)
        used += bits
    return np.argsort(packed)
