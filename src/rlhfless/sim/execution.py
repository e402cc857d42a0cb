"""Continuous batching on one decode actor, computed between events instead of token by token.

Every running sequence gains one token per engine step, so in units of engine steps a sequence
admitted at step `a` with `r` tokens to go ends at `a + r`, whatever the step durations are. With
a slot cap (KV memory) a waiting sequence takes the first slot that frees. Between two
consecutive admission/finish events the batch is constant and its mean context grows linearly,
so the wall time of that stretch is (steps) x (decode-step time at the batch and the midpoint
context) from the profile. A sequence may also have an earliest admission step (a migrant whose KV
is still on its way). The only Python loop is over admissions, and only when the cap binds or
some sequence arrives late.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from rlhfless.planner import admission
from rlhfless.planner.profile import Profile


def slot_cap(profile: Profile, context: np.ndarray, remaining: np.ndarray) -> int:
    """Concurrent sequences the actor runs (KV memory at final lengths, engine batch limit)."""
    if context.size == 0:
        return 1
    return int(profile.concurrency(float(np.mean(context + remaining))))


@dataclass
class Schedule:
    """When each sequence on an actor runs, from the moment decoding starts (`t0`, absolute s)."""

    t0: float
    ids: np.ndarray  # global sequence ids
    context: np.ndarray  # tokens already in KV when admitted here
    remaining: np.ndarray  # tokens to generate here
    start: np.ndarray  # engine step of admission
    end: np.ndarray  # engine step of the last token
    grid_steps: np.ndarray  # event steps
    grid_time: np.ndarray  # absolute seconds at those steps
    cap: int

    @property
    def finish(self) -> np.ndarray:
        """Absolute finish time of each sequence."""
        return np.interp(self.end, self.grid_steps, self.grid_time)

    @property
    def end_time(self) -> float:
        return float(self.grid_time[-1])

    def step_at(self, t: float) -> float:
        return float(np.interp(t, self.grid_time, self.grid_steps))

    def step_after(self, profile: Profile, t: float) -> float:
        """Engine step reached at time t, counting idle one-sequence steps past the end."""
        if t <= self.end_time:
            return self.step_at(t)
        tick = float(profile.decode_step_seconds(1, float(np.mean(self.context)) if self.ids.size else 1.0))
        return float(self.grid_steps[-1]) + (t - self.end_time) / max(tick, 1e-12)

    def generated_at(self, t: float) -> np.ndarray:
        """Tokens each sequence has generated here by time `t`."""
        return np.clip(self.step_at(t) - self.start, 0, self.remaining)

    def active_at(self, t: float) -> int:
        s = self.step_at(t)
        return int(np.count_nonzero((self.start <= s) & (self.end > s)))

    @property
    def peak(self) -> int:
        return min(self.cap, self.ids.size)


@dataclass
class Siblings:
    """What adaptive admission reads (`planner.admission`): each sequence's prompt, predicted
    length and tokens generated before this schedule (so a finished one's length is known)."""

    group: np.ndarray
    predicted: np.ndarray
    before: np.ndarray


def _adaptive_starts(remaining: np.ndarray, cap: int, sib: Siblings) -> np.ndarray:
    """Admission steps when every free slot takes the queued sequence its siblings now say is
    longest (`admission.estimates`); the array order is the initial queue (ties keep it)."""
    n = remaining.size
    groups, group = np.unique(sib.group, return_inverse=True)
    fin_sum = np.zeros(groups.size)
    fin_cnt = np.zeros(groups.size)
    first = np.full(groups.size, np.inf)
    start = np.full(n, np.inf)
    rest = remaining.tolist()
    heap = [(rest[i], i) for i in range(cap)]
    heapq.heapify(heap)
    start[:cap] = 0.0
    np.minimum.at(first, group[:cap], 0.0)
    waiting = np.arange(cap, n)
    total = (sib.before + remaining).tolist()
    while waiting.size:
        s = heap[0][0]
        freed = 0
        while heap and heap[0][0] <= s:
            _, i = heapq.heappop(heap)
            fin_sum[group[i]] += total[i]
            fin_cnt[group[i]] += 1
            freed += 1
        g = group[waiting]
        running_for = np.where(np.isfinite(first[g]), s - first[g], 0.0)
        est = admission.estimates(sib.predicted[waiting], fin_sum[g], fin_cnt[g], running_for)
        take = np.argsort(-est, kind="stable")[:freed]
        picked = waiting[take]
        start[picked] = s
        np.minimum.at(first, group[picked], s)
        for i in picked.tolist():
            heapq.heappush(heap, (s + rest[i], i))
        waiting = np.delete(waiting, take)
    return start


def schedule(
    profile: Profile,
    t0: float,
    ids: np.ndarray,
    context: np.ndarray,
    remaining: np.ndarray,
    cap: int,
    ready: np.ndarray | None = None,
    siblings: Siblings | None = None,
) -> Schedule:
    """Admission order is the array order (first come, first served), or with `siblings` the
    one their progress suggests (`planner.admission`); `ready`: earliest steps."""
    remaining = remaining.astype(float)
    n = remaining.size
    start = np.zeros(n) if ready is None else ready.astype(float)
    if n > cap and siblings is not None and ready is None:
        start = _adaptive_starts(remaining, cap, siblings)
    elif n > cap:
        rest, begin = remaining.tolist(), start.tolist()
        if ready is None:
            ends, first = rest[:cap], cap
        else:
            ends, first = [0.0] * cap, 0
        heapq.heapify(ends)
        for j in range(first, n):
            b = begin[j] = max(ends[0], begin[j])
            heapq.heapreplace(ends, b + rest[j])
        start = np.array(begin)
    end = start + remaining
    if n == 0:
        grid = np.zeros(1)
        return Schedule(t0, ids, context, remaining, start, end, grid, np.full(1, t0), cap)
    grid = np.unique(np.concatenate([start, end]))
    by_start = np.argsort(start, kind="stable")
    by_end = np.argsort(end, kind="stable")
    n_started = np.searchsorted(start[by_start], grid[:-1], side="right")
    n_ended = np.searchsorted(end[by_end], grid[:-1], side="right")
    active = n_started - n_ended
    # Sum of contexts of the running sequences at step s: sum(context - start) + active * s.
    offset = context - start
    sum_offset = np.concatenate([[0.0], np.cumsum(offset[by_start])])[n_started]
    sum_offset -= np.concatenate([[0.0], np.cumsum(offset[by_end])])[n_ended]
    mid = (grid[:-1] + grid[1:]) / 2
    mean_context = (sum_offset + active * mid) / np.maximum(active, 1)
    # An idle stretch (waiting for a late arrival) ticks at the engine's one-sequence step time.
    dt = np.diff(grid) * profile.decode_step_seconds(np.maximum(active, 1), mean_context)
    times = t0 + np.concatenate([[0.0], np.cumsum(dt)])
    return Schedule(t0, ids, context, remaining, start, end, grid, times, cap)
