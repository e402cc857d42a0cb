"""Continuous batching on one decode actor, computed between events instead of token by token.

Every running sequence gains one token per engine step, so in units of engine steps a sequence
admitted at step `a` with `r` tokens to go ends at `a + r`, whatever the step durations are. With
a slot cap (KV memory) a waiting sequence takes the first slot that frees. Between two
consecutive admission/finish events the batch is constant and its mean context grows linearly,
so the wall time of that stretch is (steps) x (decode-step time at the batch and the midpoint
context) from the profile. The only Python loop is over the waiting queue, and only when the cap
binds.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from rlhfless.planner.profile import Profile


def slot_cap(profile: Profile, context: np.ndarray, remaining: np.ndarray) -> int:
    """Concurrent sequences the KV cache holds, each counted at its final length."""
    if context.size == 0:
        return 1
    return max(1, int(profile.max_kv_tokens // max(1.0, float(np.mean(context + remaining)))))


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

    def generated_at(self, t: float) -> np.ndarray:
        """Tokens each sequence has generated here by time `t`."""
        return np.clip(self.step_at(t) - self.start, 0, self.remaining)

    def active_at(self, t: float) -> int:
        s = self.step_at(t)
        return int(np.count_nonzero((self.start <= s) & (self.end > s)))

    @property
    def peak(self) -> int:
        return min(self.cap, self.ids.size)


def schedule(
    profile: Profile, t0: float, ids: np.ndarray, context: np.ndarray, remaining: np.ndarray, cap: int
) -> Schedule:
    """Admission order is the array order (first come, first served)."""
    remaining = remaining.astype(float)
    n = remaining.size
    start = np.zeros(n)
    if n > cap:
        ends = list(remaining[:cap])
        heapq.heapify(ends)
        for j in range(cap, n):
            free = ends[0]
            start[j] = free
            heapq.heapreplace(ends, free + remaining[j])
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
    dt = np.diff(grid) * profile.decode_step_seconds(active, mean_context)
    times = t0 + np.concatenate([[0.0], np.cumsum(dt)])
    return Schedule(t0, ids, context, remaining, start, end, grid, times, cap)


def prefill_seconds(profile: Profile, tokens: float, chunk: int = 2048) -> float:
    """Prefill `tokens` prompt tokens in chunks of `chunk` (vLLM's batched, chunked prefill)."""
    if tokens <= 0:
        return 0.0
    full, rest = divmod(float(tokens), chunk)
    return float(full * profile.prefill_seconds(chunk) + profile.prefill_seconds(rest))
