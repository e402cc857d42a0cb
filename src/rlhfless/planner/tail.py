"""How far a step's groups outrun their predictions, and when a plan of many actors ends.

Predicted lengths miss both ways, and an actor waits for the longest of its groups, which outruns
the longest prediction further the more groups it holds (`Tail`): with each group's observed max
its prediction times an independent ratio r of the run's (`LengthPredictor.tail_ratios`), a range
ends no sooner than its expected longest, E[max] = integral of 1 - prod_i F(y / p_i) dy up to the
longest prediction times the largest ratio, or the cap (F: the ratios' distribution, p_i: the
predicted maxima). `timemodel.RangeModel` sums log F over each range's prompts and times the steps
past its longest prediction at batch 1. An A100 PPO step of one sample a prompt (GPQA-like, 1k
cap, simulated) put its 176 shortest-predicted prompts on one actor: forecast 7.6 s without the
tail, 8.8 s run. A plan of many actors ends with the last of them, each drawing its own longest
group (`expected_end`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

TAIL_POINTS = 17  # lengths at which a range's longest is integrated (`Tail`)


@dataclass(frozen=True)
class Tail:
    """How far the run's group maxima outran their predictions: `ratios`, observed over planned,
    at even quantile levels 0..1 (`LengthPredictor.tail_ratios`); `cap`, the response cap (None:
    none known). Timed with it, a range ends no sooner than its expected longest group."""

    ratios: tuple[float, ...]
    cap: float | None = None

    @classmethod
    def of(cls, ratios: list[float], cap: float | None) -> Tail | None:
        """The run's tail, or None before it has measured one."""
        return cls(tuple(ratios), cap) if len(ratios) > 1 else None

    def log_below(self, group_max: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lengths y, log P(a group's observed max <= y) per distinct predicted maximum and y, and
        each prompt's row of it) for predicted maxima `group_max`: the integrand of each range's
        expected longest, as prefix sums add it up."""
        # No group outruns the longest prediction times the largest ratio, nor the cap: up to 8k
        # caps over predictions of 300-900, the cap alone left one length per 512 tokens, and the
        # expected longest came out at about its bound (`RangeModel._outrun`).
        top = float(group_max.max(initial=1.0)) * self.ratios[-1]
        top = min(top, self.cap) if self.cap is not None else top
        y = np.linspace(0.0, top, TAIL_POINTS)
        # Predicted maxima that are whole token counts repeat (16,384 prompts, 1,698 values in
        # `bench_planner`): each value is interpolated once, a binary search per point, and a
        # prompt order's rows are gathered from the small table, which stays in cache. Smoothed
        # ones (an EWMA over epochs) rarely repeat, and sorting them would cost more than it saves.
        if np.array_equal(group_max, np.floor(group_max)):
            values, inverse = np.unique(group_max, return_inverse=True)
        else:
            values, inverse = group_max, np.arange(group_max.size)
        f = np.interp(
            y / np.maximum(values, 1.0)[:, None], self.ratios, np.linspace(0.0, 1.0, len(self.ratios))
        )
        if self.cap is not None:
            f[:, -1] = 1.0  # no group runs past the cap
        return y, np.log(np.maximum(f, 1e-300)), inverse.ravel()


MAKESPAN_POINTS = 17  # times at which a plan's expected end is integrated (`expected_end`)
# What `RangeModel.times` adds per range where the run has a tail, for `expected_end`: its expected
# outrun (s), longest prediction, one-sequence step (s), the top of the tail's lengths, the largest
# ratio, and log P(its longest group <= y) at TAIL_POINTS lengths evenly from 0 to that top.
SPREAD = ("outrun", "longest", "step1", "tail_top", "most", "log_below")


def expected_end(
    end: np.ndarray, first: np.ndarray, spread: Mapping[str, np.ndarray] | None = None
) -> np.ndarray:
    """Per plan (its actors' rows from each of `first` on), when its last actor is expected to
    end: E[max_i T_i], not max_i E[T_i]. An actor expected to end at `end` holds an expected
    outrun of its longest group L past its longest prediction (`spread`, as `SPREAD` says), so
    it ends at T = end - outrun + (L - longest)^+ x step1, L at most longest x the largest ratio.
    Actors planned to end alike each risk the step's end: the plan whose actors all end at its
    forecast ends later than one whose others end well before its longest. Without a tail
    (`spread` None), the latest actor's `end`."""
    latest = np.maximum.reduceat(end, first)
    if not spread:
        return latest
    outrun, longest, step1, top, most, log_below = (spread[k] for k in SPREAD)
    base = end - outrun
    rows = np.arange(end.size)
    plan_of = np.repeat(np.arange(first.size), np.diff(np.r_[first, end.size]))
    lo = np.maximum.reduceat(base, first)
    # Each actor's L has surely ended at the first length where P(L <= y) is 1, or at its bound:
    # the integral runs to the latest such end, so its points are spent where the ends spread.
    points = log_below.shape[1]
    done = np.argmax(log_below >= -1e-9, axis=1)
    done_y = np.minimum(top * done / (points - 1), longest * most)
    high = np.maximum.reduceat(base + np.maximum(done_y - longest, 0.0) * step1, first)
    t = lo[:, None] + (high - lo)[:, None] * np.linspace(0.0, 1.0, MAKESPAN_POINTS)
    # Per actor and time t, its longest group's length y at which it ends at t, and log P(L <= y)
    # between the tail's lengths. In place and by `take` (a (rows, 17) table per candidate table):
    # the same roundings as the plain expressions, with fewer fresh temporaries.
    y = t.take(plan_of, axis=0)
    y -= base[:, None]
    y /= np.maximum(step1, 1e-12)[:, None]
    y += longest[:, None]
    at = y / np.maximum(top, 1e-12)[:, None]
    at *= points - 1
    k = at.astype(np.int64)  # truncated: floored where at >= 0, and clipped to 0 below
    np.maximum(k, 0, out=k)
    np.minimum(k, points - 2, out=k)
    frac = at - k
    np.maximum(frac, 0.0, out=frac)
    np.minimum(frac, 1.0, out=frac)
    k += (rows * points)[:, None]
    flat = log_below.ravel()
    lower = flat.take(k)
    k += 1
    log_p = flat.take(k)
    log_p -= lower
    log_p *= frac
    log_p += lower  # log P linear between lengths
    log_p[(at >= points - 1) | (y >= done_y[:, None])] = 0.0  # every group has ended
    below = np.exp(np.add.reduceat(log_p, first, axis=0))  # P(every actor has ended by t)
    gap = 1.0 - below
    mean_gap = 0.5 * (gap[:, 1:] + gap[:, :-1]).sum(axis=1) / (MAKESPAN_POINTS - 1)
    return np.maximum(lo + (high - lo) * mean_gap, latest)


def plan_end(end: np.ndarray, parts: Mapping[str, np.ndarray]) -> float:
    """When one plan, whose actors `RangeModel.times` timed (`parts`) to end at `end`, is
    expected to end (`expected_end`; its latest actor where the run has no tail)."""
    return float(expected_end(end, np.zeros(1, dtype=np.int64), parts if SPREAD[0] in parts else None)[0])
