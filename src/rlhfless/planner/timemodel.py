"""T(X_i, G_i): how long an actor takes to decode its prompts under continuous batching.

The estimate is piecewise in response length, never token by token. Each prompt stands for G
sequences: one of the predicted group max and G - 1 of the length that keeps the predicted group
mean. Response lengths are cut into segments [t_k, t_k+1) (quantiles of all predicted lengths).
Within a segment an actor's batch is the number of its sequences still running, so for an actor

    tokens_k = sum over its sequences of the part of [t_k, t_k+1) they generate (exact),
    steps_k  = the part of [t_k, t_k+1) its longest sequence covers (exact),
    batch_k  = tokens_k / steps_k (the batch shrinks as predicted lengths run out),
    context_k = mean prompt length + middle of the segment's generated part.

A cap admits at most K = `Profile.concurrency(mean prompt + mean response)` sequences at a time (KV
memory, engine batch limit);
segments whose batch would exceed K run at batch K for tokens_k / K steps (queued sequences join as
others finish), the rest drain as above. Time = sum_k steps_k * decode_step(batch_k, context_k).

Predicted lengths miss both ways, and an actor waits for the longest of its groups, which outruns
the longest prediction further the more groups it holds: with the run's tail (`planner.tail`), a
range ends no sooner than its expected longest group, and the steps past its longest prediction
run at batch 1.

Every statistic an actor needs is a difference of prefix sums over prompts in a fixed order, so any
set of contiguous ranges (all actors of all candidate N at once) is evaluated in a few numpy passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rlhfless.planner.profile import Profile
from rlhfless.planner.range_max import RangeMax
from rlhfless.planner.tail import SPREAD, Tail

BLOCK = 1024  # ranges timed at once (their temporaries stay in cache)


@dataclass
class Workload:
    """Per-prompt facts (input order) that the time model needs."""

    group_max: np.ndarray  # predicted longest response of the prompt's G samples
    group_mean: np.ndarray  # predicted mean response length
    prompt_tokens: np.ndarray  # full prompt length (context of every sample)
    decode_prefill: np.ndarray  # tokens the decode actor prefills for this prompt
    kv_tokens: np.ndarray  # prefix tokens whose KV the decode actor receives
    group_size: int
    tail: Tail | None = None  # timed by its expected longest, where the run measured one
    # `tail_below`, where a workload of the same predictions and tail worked it out already
    known_tail: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    @property
    def tail_below(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """`Tail.log_below` of every prompt (input order), once for every order that times it."""
        if self.known_tail is None and self.tail is not None:
            self.known_tail = self.tail.log_below(self.group_max)
        return self.known_tail

    @property
    def size(self) -> int:
        return int(self.group_max.size)

    @property
    def rest_length(self) -> np.ndarray:
        """Length of the G - 1 non-longest samples so that the group mean is kept."""
        g = self.group_size
        if g == 1:
            return self.group_max.copy()
        return np.clip((g * self.group_mean - self.group_max) / (g - 1), 0.0, self.group_max)

    @property
    def work(self) -> np.ndarray:
        """Predicted decode tokens per prompt (all its samples)."""
        return self.group_max + (self.group_size - 1) * self.rest_length


def _prefix(x: np.ndarray) -> np.ndarray:
    """Prefix sums along axis 0, from 0, in `x`'s dtype: integer counts sum exact and several
    times faster than floats, whose sums numpy runs one dependent add at a time."""
    out = np.zeros((x.shape[0] + 1, *x.shape[1:]), dtype=x.dtype)
    np.cumsum(x, axis=0, out=out[1:])
    return out


def _longest_at(
    running: np.ndarray, tokens: np.ndarray, j: np.ndarray, start: np.ndarray, width: np.ndarray
) -> np.ndarray:
    """Per row, the length of its j-th longest sequence. `running`: how many sequences still run
    at each segment's start (non-increasing); `tokens`: the tokens generated in each segment. In
    the segment where the count falls past j, the sequences that end there are taken to end
    together, where the segment's tokens say (exact when their lengths are alike)."""
    rows, segments = running.shape
    # how many segments start with j or more running: a product with ones sums each short row
    # in one call (exact: counts), where a reduction along it pays numpy's per-row setup
    at = ((running >= j[:, None]) @ np.ones(segments)).astype(np.intp)
    at -= 1
    np.maximum(at, 0, out=at)
    cell = np.arange(0, rows * segments, segments)  # each row's first cell, flat
    cell += at
    now = running.take(cell)  # `take` on the flat cells: a third of fancy indexing's time
    after = np.where(at < segments - 1, running.take(np.minimum(cell + 1, running.size - 1)), 0.0)
    w = width.take(at)
    part = tokens.take(cell)
    part -= after * w
    part /= np.maximum(now - after, 1e-12)
    np.maximum(part, 0.0, out=part)
    np.minimum(part, w, out=part)
    return start.take(at) + part


def _clipped(lengths: np.ndarray, start: np.ndarray, width: np.ndarray) -> np.ndarray:
    """Per segment (rows) and length (columns): the part of [start, start + width) it covers."""
    out = np.subtract(lengths, start[:, None])
    np.maximum(out, 0.0, out=out)
    return np.minimum(out, width[:, None], out=out)


def _block_sums(x: np.ndarray, starts: np.ndarray, ufunc: np.ufunc = np.add) -> np.ndarray:
    """`ufunc` reduced over x's rows [starts[j], starts[j + 1]) (the last to the end); an empty
    block is 0 (`reduceat` would give its first row)."""
    held = np.diff(np.r_[starts, x.shape[0]]) > 0
    out = np.zeros((starts.size, *x.shape[1:]), x.dtype)
    if held.any():
        out[held] = ufunc.reduceat(x, starts[held], axis=0)
    return out


@dataclass(frozen=True)
class PromptSegments:
    """Per prompt, in `order`: the tokens its G sequences generate in each length segment
    [edges[k], edges[k + 1]), how many of them still run at each segment's start, its longest
    and its decode tokens. What a `RangeModel` sums, worked out once for every order and split
    of the same prompts."""

    order: np.ndarray
    edges: np.ndarray
    tokens: np.ndarray  # (segments, prompts)
    running: np.ndarray  # (segments, prompts), whole sequence counts
    longest: np.ndarray
    work: np.ndarray

    @classmethod
    def of(cls, workload: Workload, order: np.ndarray, segments: int) -> PromptSegments:
        """Segments at quantiles of every predicted length (`segments` of them, at most)."""
        g = workload.group_size
        longest = workload.group_max[order]
        rest = workload.rest_length[order]
        lengths = np.concatenate((longest, rest)) if g > 1 else longest
        edges = np.quantile(lengths, np.linspace(0.0, 1.0, segments + 1)) if lengths.size else np.zeros(2)
        edges = np.unique(np.concatenate(([0.0], edges)))
        if edges.size == 1:
            edges = np.array([0.0, 1.0])
        start, width = edges[:-1], np.diff(edges)
        tokens = _clipped(longest, start, width)
        running = (longest > start[:, None]).astype(np.int64)
        if g > 1:
            more = _clipped(rest, start, width)
            more *= g - 1
            tokens += more
            running += (g - 1) * (rest > start[:, None])
        return cls(order, edges, tokens, running, longest, longest + (g - 1) * rest)

    def reordered(self, order: np.ndarray) -> PromptSegments:
        """The same prompts and segments in another order."""
        at = np.empty_like(self.order)
        at[self.order] = np.arange(self.order.size)
        rows = at[order]
        return PromptSegments(
            order,
            self.edges,
            self.tokens.take(rows, axis=1),  # `take`: a third of fancy indexing's time here
            self.running.take(rows, axis=1),
            self.longest[rows],
            self.work[rows],
        )


class RangeModel:
    """Prefix sums of a workload in a fixed prompt order; times any contiguous ranges of it."""

    def __init__(
        self,
        workload: Workload,
        order: np.ndarray,
        profile: Profile,
        segments: int,
        blocks: np.ndarray | None = None,
    ) -> None:
        """`blocks`: where (in `order`) the only ranges ever timed start, back to back from 0 to
        the end. Each is then summed once, not every prompt's prefix, and a range is given in
        blocks: block j is [j, j + 1). A fixed split (verl's, a plan's actors) is timed so."""
        self._fill(workload, PromptSegments.of(workload, order, segments), profile, blocks)

    @classmethod
    def over(
        cls, workload: Workload, segments: PromptSegments, profile: Profile, blocks: np.ndarray | None = None
    ) -> RangeModel:
        """The model of `segments` worked out already (their order, and `blocks` as above)."""
        model = object.__new__(cls)
        model._fill(workload, segments, profile, blocks)
        return model

    def _fill(
        self, workload: Workload, seg: PromptSegments, profile: Profile, blocks: np.ndarray | None
    ) -> None:
        """Prefix sums of `seg`'s prompts (of `blocks`' sums, where given)."""
        w, order = workload, seg.order
        self.workload, self.profile, self.group_size = w, profile, w.group_size
        self.order, self.edges, self.prompt_segments = order, seg.edges, seg

        def rows(x: np.ndarray) -> np.ndarray:
            return x if blocks is None else _block_sums(x, blocks)

        self._prompts = _prefix(rows(np.ones(order.size, dtype=np.int64)))
        self._tokens = _prefix(rows(seg.tokens.T))
        self._running = _prefix(rows(seg.running.T))
        self._work = _prefix(rows(seg.work))
        self._context = _prefix(rows(w.prompt_tokens[order].astype(float)))
        self._prefill = _prefix(rows(w.decode_prefill[order].astype(float)))
        self._kv = _prefix(rows(w.kv_tokens[order].astype(float)))
        longest = seg.longest if blocks is None else _block_sums(seg.longest, blocks, np.maximum)
        self.range_max = RangeMax(longest)  # each range's longest predicted group
        self._tail_y, self._tail = None, None  # `Tail`: lengths, and prefix sums of log F over them
        if w.tail_below is not None:
            self._tail_y, below, row_of = w.tail_below
            self._tail = _prefix(rows(below.take(row_of[order], axis=0)))

    def reordered(self, order: np.ndarray) -> RangeModel:
        """The same workload, segments and time table in another prompt order."""
        return RangeModel.over(self.workload, self.prompt_segments.reordered(order), self.profile)

    def in_waves(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Whether each range holds more sequences than an actor decodes at once."""
        prompts = np.maximum(self._prompts[ends] - self._prompts[starts], 1)
        mean_prompt = (self._context[ends] - self._context[starts]) / prompts
        seqs = prompts * self.group_size
        return seqs > self.profile.concurrency(mean_prompt + self._work_of(starts, ends) / seqs)

    def _work_of(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        return self._work[ends] - self._work[starts]

    @property
    def cum_work(self) -> np.ndarray:
        """Prefix sums of predicted decode tokens in this model's prompt order."""
        return self._work

    def _segments(
        self,
        starts: np.ndarray,
        ends: np.ndarray,
        longest: np.ndarray,
        cap: np.ndarray,
        mean_prompt: np.ndarray,
        reached: int,
        seqs: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Decode steps and seconds per step of each range in the first `reached` segments, and
        the steps its waves add or take off (below) with the context they run at (`times` prices
        them, for all blocks in one lookup).

        Over the cap, K sequences run at a time for tokens / K steps (queued ones join later).
        A range of no prompts has no tokens, so batch 0, whose step the profile prices at 0: it
        adds nothing. Operations run in place, in the order that fixes every rounding.

        Over the cap the segments miscount an actor's steps both ways. Sequences are not
        preempted, so the K+1-th longest starts only when one of the K longest ends: the last
        ends no sooner than p_K + p_K+1 steps (p_j the j-th longest, read from how many sequences
        still run at each segment's start), which a share of the slots misses where p_K is long
        (lengths alike: a second wave runs almost alone). And the longest sequences start first,
        so their last steps run beside the queued ones, where the segments count them after all
        the waves. Longest first onto the first free slot, the actor takes about the most of
        p_K + p_K+1, its longest sequence and its tokens over K steps; the steps the segments
        counted beyond (or short of) that are taken off (or added) at their fixed part, the
        one-sequence step time, since every token is already counted at its batch."""
        start, width = self.edges[:reached], np.diff(self.edges[: reached + 1])
        tokens = self._tokens[:, :reached].take(ends, axis=0)
        tokens -= self._tokens[:, :reached].take(starts, axis=0)
        waves = np.flatnonzero(seqs > cap)
        if waves.size:
            running = np.subtract(
                self._running[:, :reached].take(ends[waves], axis=0),
                self._running[:, :reached].take(starts[waves], axis=0),
                dtype=float,
            )
            k = cap[waves]
            mine = tokens[waves]
            paired = _longest_at(running, mine, k, start, width) + _longest_at(
                running, mine, k + 1, start, width
            )
            least = np.maximum(np.maximum(paired, longest[waves]), mine.sum(axis=1) / k)
        steps = np.subtract(longest[:, None], start)
        np.maximum(steps, 0.0, out=steps)
        np.minimum(steps, width, out=steps)
        batch = np.maximum(steps, 1e-12)
        np.divide(tokens, batch, out=batch)
        np.minimum(batch, cap[:, None], out=batch)
        np.divide(tokens, cap[:, None], out=tokens)
        np.maximum(steps, tokens, out=steps)
        context = np.minimum(steps, width)
        context *= 0.5
        context += mean_prompt[:, None] + start
        late, late_context = np.zeros(starts.size), np.zeros(starts.size)
        if waves.size:
            late[waves] = least - steps[waves].sum(axis=1)
            late_context[waves] = mean_prompt[waves] + 0.5 * least
        return steps, self.profile.decode_step_seconds(batch, context), late, late_context

    def _outrun(
        self, starts: np.ndarray, ends: np.ndarray, longest: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each range's expected longest group past its longest prediction (`Tail`), in steps, and
        log P(its longest group <= y) at the tail's lengths."""
        log_p = self._tail.take(ends, axis=0)
        log_p -= self._tail.take(starts, axis=0)
        p, rise = np.exp(log_p), np.diff(log_p, axis=1)
        # P is steep (a power of many F): exact for log P linear between the lengths y (in place)
        flat = np.abs(rise) < 1e-9
        rise[flat] = 1.0
        held = np.diff(p, axis=1)
        held /= rise
        np.copyto(held, p[:, :-1], where=flat)
        held *= np.diff(self._tail_y)
        expected = self._tail_y[-1] - held.sum(axis=1)
        # No group outruns its prediction by more than the largest ratio: where the ratios sit at
        # one value (exact predictions), the lengths' spacing would otherwise count as outrun.
        expected = np.minimum(expected, longest * self.workload.tail.ratios[-1])
        held_any = self._prompts[ends] > self._prompts[starts]
        return np.where(held_any, np.maximum(expected - longest, 0.0), 0.0), log_p

    def times(self, starts: np.ndarray, ends: np.ndarray) -> dict[str, np.ndarray]:
        """Per range [start, end) of prompts: decode and prefill seconds, tokens it prefills, KV
        tokens it receives, decode tokens.

        A segment that starts at or past a range's longest sequence has neither steps nor tokens
        (both exactly 0): ranges are timed in order of the segments they reach, each block only
        over the segments its ranges reach, the rest left 0."""
        prompts = (self._prompts[ends] - self._prompts[starts]).astype(float)
        seqs = prompts * self.group_size
        work = self._work[ends] - self._work[starts]
        mean_prompt = (self._context[ends] - self._context[starts]) / np.maximum(prompts, 1)
        cap = self.profile.concurrency(mean_prompt + work / np.maximum(seqs, 1))
        longest = self.range_max(starts, ends)
        reach = np.searchsorted(self.edges[:-1], longest, side="left")
        by_reach = np.argsort(reach, kind="stable")
        steps = np.zeros((starts.size, self.edges.size - 1))
        step_s = np.zeros_like(steps)
        late = np.zeros((2, starts.size))  # waves' steps, and the context they run at
        for lo in range(0, starts.size, BLOCK):
            rows = by_reach[lo : lo + BLOCK]
            reached = int(reach[rows[-1]])
            at = (slice(lo, lo + BLOCK), slice(0, reached))
            steps[at], step_s[at], late[0, lo : lo + BLOCK], late[1, lo : lo + BLOCK] = self._segments(
                starts[rows], ends[rows], longest[rows], cap[rows], mean_prompt[rows], reached, seqs[rows]
            )
        tailed = self._tail is not None
        # One lookup of the one-sequence step: at the waves' contexts, and at each range's
        # longest for the steps past it (`Tail`).
        at_one = late[1] if not tailed else np.concatenate((late[1], mean_prompt + longest))
        one = self.profile.decode_step_seconds(1.0, at_one)
        decode = np.empty(starts.size)
        decode[by_reach] = np.einsum("ij,ij->i", steps, step_s) + late[0] * one[: starts.size]
        spread = {}
        if tailed:
            step1 = one[starts.size :]
            steps, log_below = self._outrun(starts, ends, longest)
            outrun = steps * step1
            decode += outrun
            spread = dict(
                zip(
                    SPREAD,
                    (
                        outrun,
                        longest,
                        step1,
                        np.full(starts.size, self._tail_y[-1]),
                        np.full(starts.size, self.workload.tail.ratios[-1]),
                        log_below,
                    ),
                    strict=True,
                )
            )
        prefill_tokens = self._prefill[ends] - self._prefill[starts]
        return {
            "decode": decode,
            "prefill": self.profile.prefill_seconds(prefill_tokens),
            "prefill_tokens": prefill_tokens,
            "kv_tokens": self._kv[ends] - self._kv[starts],
            "work": work,
            **spread,
        }
