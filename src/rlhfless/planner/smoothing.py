"""The exponentially weighted mean every learned figure of the planner follows over steps."""

from __future__ import annotations


def ewma(old: float | None, new: float, alpha: float) -> float:
    """`new` weighted `alpha` against the mean so far (`None`: nothing seen yet, so `new`)."""
    return new if old is None else alpha * new + (1.0 - alpha) * old
