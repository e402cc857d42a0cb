"""How well predicted response lengths matched the observed ones: the figures the runtime logs and
the report plots each step (error, share within 50 / 100 tokens, and how well they rank, since the
schedule sorts by them)."""

from __future__ import annotations

from typing import Any

import numpy as np


def _inversions(y: np.ndarray) -> int:
    """Pairs i < j with y[i] > y[j], for integer ranks y in [0, n): bottom-up merge, vectorised."""
    n = y.size
    y = y.astype(np.int64)
    idx = np.arange(n)
    total = 0
    width = 1
    while width < n:
        block = idx // (2 * width)
        left = (idx % (2 * width)) < width
        key = y + block * n
        lkeys = key[left]
        rkeys, rblock = key[~left], block[~left]
        pos = np.searchsorted(lkeys, rkeys, side="right")
        end = np.searchsorted(lkeys, (rblock + 1) * n, side="left")
        total += int((end - pos).sum())
        y = np.sort(key) - block * n
        width *= 2
    return total


def _tied_pairs(x: np.ndarray) -> int:
    _, counts = np.unique(x, return_counts=True)
    return int((counts * (counts - 1) // 2).sum())


def kendall_tau(x: Any, y: Any) -> float:
    """Kendall's tau-b in O(n log n); nan when either side is constant or has < 2 points."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = x.size
    if n < 2:
        return float("nan")
    order = np.lexsort((y, x))
    xs, ys = x[order], y[order]
    ranks = np.unique(ys, return_inverse=True)[1]
    discordant = _inversions(ranks)
    n0 = n * (n - 1) // 2
    n1, n2 = _tied_pairs(xs), _tied_pairs(ys)
    n3 = _tied_pairs(xs + 1j * ys)
    denom = np.sqrt(float(n0 - n1) * float(n0 - n2))
    if denom == 0:
        return float("nan")
    return float((n0 - n1 - n2 + n3 - 2 * discordant) / denom)


def prediction_quality(predicted: Any, observed: Any) -> dict[str, float]:
    """Report figures: mean absolute error, share within 50 / 100 tokens, Kendall tau of the ranking."""
    p, o = np.asarray(predicted, dtype=float), np.asarray(observed, dtype=float)
    if p.shape != o.shape or p.size == 0:
        raise ValueError(f"predicted/observed: got shapes {p.shape} and {o.shape}, expected equal, non-empty")
    err = np.abs(p - o)
    return {
        "mae": float(err.mean()),
        "within_50": float((err <= 50).mean()),
        "within_100": float((err <= 100).mean()),
        "kendall_tau": kendall_tau(p, o),
    }
