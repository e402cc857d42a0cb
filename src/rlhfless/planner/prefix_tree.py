"""Which shared prompt prefixes the prefill actor computes: the paper's D(L) rule, or a prefix tree.

Both rules work on the prompts in sorted order with `e_i`, the common prefix of sorted neighbours
i and i+1 (`PackedPrompts`), and both end in the same form: per prompt, the `k` first tokens it
receives as KV (at most its length - 1: its last token's logits start the response, so its decode
actor computes at least that one), and the levels that compute those prefixes once each.

- **paper**: the largest L whose D(L) distinct L-prefixes fit the capacity; every prompt gets
  its first min(L, length - 1) tokens, and each distinct prefix is one level computed from
  scratch. A system prompt shared by prompts that differ before L is computed once per group.
- **tree**: every prefix that two prompts share, or, when those do not fit the capacity, the
  better of a common depth cut and a cut to the prefixes at least m prompts share. The
  compressed trie over them is the levels: each node's tokens are computed once, starting from
  its parent's KV, so every shared token is computed once and each prompt's own part once, by
  its decode actor.

Sorted order keeps every shared prefix's prompts contiguous, so the counts are histograms and
window minima over `e` (numpy, O(n) per candidate); the trie is built with one stack over the
distinct shared prefixes (at most the capacity of them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Levels:
    """The prefix tree's nodes, parents first. Node j holds tokens [start, end) of the prompts
    below it (start = its parent's end, 0 at the root), computed once from its parent's KV."""

    parent: np.ndarray
    start: np.ndarray
    end: np.ndarray

    @property
    def tokens(self) -> int:
        """Prompt tokens the prefill actor computes: every node's own tokens, once."""
        return int((self.end - self.start).sum())


@dataclass
class Shared:
    """A rule's choice, per prompt in sorted order: the `k` first tokens it receives as KV, the
    node whose path holds them (-1: none), the nodes, and the count curve the cut was chosen on."""

    k: np.ndarray
    node: np.ndarray
    levels: Levels
    curve: np.ndarray  # paper: D(L) for L = 0..longest (tree: empty)
    deepest: int  # no prompt's shared prefix is longer (paper: the chosen L)


def paper(lengths_sorted: np.ndarray, e: np.ndarray, capacity: int) -> Shared:
    """D(L) = 1 + #{e_i < L}: the largest L with D(L) <= capacity (D is non-decreasing in L).
    Each distinct L-prefix is a node computed from scratch."""
    n = lengths_sorted.size
    longest = int(lengths_sorted.max()) if n else 0
    hist = np.bincount(e, minlength=longest + 2)
    curve = np.concatenate(([1], 1 + np.cumsum(hist[:longest]))) if n else np.ones(1, dtype=np.int64)
    fits = np.flatnonzero(curve[1:] <= capacity)
    length = int(fits[-1] + 1) if fits.size else 0
    k = np.clip(np.minimum(lengths_sorted - 1, length), 0, None)
    if length == 0:
        return Shared(k, np.full(n, -1), _no_levels(), curve, 0)
    breaks = np.concatenate(([True], e < length))
    group = np.cumsum(breaks) - 1
    # A group's prefix stops one short of its longest prompt: that prompt computes its last token.
    end = np.minimum(np.maximum.reduceat(lengths_sorted, np.flatnonzero(breaks)) - 1, length)
    kept = end > 0
    node = np.where(kept[group] & (k > 0), (np.cumsum(kept) - 1)[group], -1)
    levels = Levels(np.full(int(kept.sum()), -1), np.zeros(int(kept.sum()), dtype=np.int64), end[kept])
    return Shared(k, node, levels, curve, length)


def tree(lengths_sorted: np.ndarray, e: np.ndarray, capacity: int) -> Shared:
    """The compressed trie over every prefix two prompts share (each prompt's t_i: its longest
    prefix shared with another) when that fits `capacity`; else the better (fewer prompt tokens
    computed) of two cuts that fit: the deepest common depth L (`_depth_cut`, which never
    computes more than the paper's rule) and the fewest prompts m a level must be shared by
    (`_shared_by_cut`, which keeps a widely shared level whole however deep it runs, a long task
    template beside short ones). A prompt receives k_i = min(t_i, len_i - 1) tokens of its
    node's path.

    The fit counts the runs of equal non-empty P_i[:t_i] in sorted order, at least the trie's
    leaves, so no level's forward is wider than `capacity`."""
    n = lengths_sorted.size
    if not n:
        return Shared(lengths_sorted, lengths_sorted, _no_levels(), np.zeros(0, dtype=np.int64), 0)
    e = np.minimum(e, lengths_sorted.max())  # identical prompts: any value >= their length
    full = _shared(lengths_sorted, e, 2)
    if _run_starts(full, e).size <= capacity:
        return _levels(lengths_sorted, e, full)
    by_depth = _levels(lengths_sorted, e, _depth_cut(full, e, capacity))
    by_count = _levels(lengths_sorted, e, _shared_by_cut(lengths_sorted, e, capacity))
    computed = [s.levels.tokens - int(s.k.sum()) for s in (by_depth, by_count)]
    return by_depth if computed[0] <= computed[1] else by_count


def _levels(lengths_sorted: np.ndarray, e: np.ndarray, t: np.ndarray) -> Shared:
    """The trie over the prefixes P_i[:t_i] and what each prompt receives of it."""
    k = np.clip(np.minimum(t, lengths_sorted - 1), 0, None)
    run, first, shared = _runs(t, e)
    levels, node_of_run = _trie(t[first], shared)
    node = np.full(t.size, -1)
    node[run >= 0] = node_of_run[run[run >= 0]]
    levels, node = _trimmed(levels, node, k)
    return Shared(k, np.where(k > 0, node, -1), levels, np.zeros(0, dtype=np.int64), int(k.max()))


def _depth_cut(s: np.ndarray, e: np.ndarray, capacity: int) -> np.ndarray:
    """min(s_i, L) for the largest L whose C(L) fits: C(L) counts the prompts whose prefix
    P_i[:min(s_i, L)] is non-empty and differs from its predecessor's, which with
    c = min(s_{i-1}, s_i, e_{i-1}) happens exactly when L > c, unless s_{i-1} = s_i <= e_{i-1}
    (the same prefix at every cut). C is non-decreasing in L, like D, and C(L) <= D(L)."""
    longest = int(s.max())
    thr = np.zeros(s.size, dtype=np.int64)
    thr[1:] = np.minimum(np.minimum(s[1:], s[:-1]), e)
    thr[1:][(s[1:] == s[:-1]) & (e >= s[1:])] = longest + 1
    curve = np.cumsum(np.bincount(thr[s > 0], minlength=longest + 1)[:longest])  # C(1), ..., C(longest)
    fits = np.flatnonzero(curve <= capacity)
    return np.minimum(s, int(fits[-1] + 1) if fits.size else 0)


def _shared_by_cut(lengths_sorted: np.ndarray, e: np.ndarray, capacity: int) -> np.ndarray:
    """Each prompt's longest prefix that m prompts share, for the least m whose runs fit (found
    galloping up from m = 3, then bisecting; a leaf holds m prompts, so m > 2n / capacity fits)."""

    def fit(m: int) -> np.ndarray | None:
        t = _shared(lengths_sorted, e, m)
        return t if _run_starts(t, e).size <= capacity else None

    lo, hi = 2, 3
    while (t := fit(hi)) is None:
        lo, hi = hi, 2 * hi - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if (found := fit(mid)) is not None:
            hi, t = mid, found
        else:
            lo = mid
    return t


def _trimmed(levels: Levels, node: np.ndarray, k: np.ndarray) -> tuple[Levels, np.ndarray]:
    """Leaves whose prompts all stop one token short (identical prompts, each computing its own
    last token) end a token sooner; one left empty goes, its prompts to its parent."""
    used = np.zeros(levels.end.size, dtype=np.int64)
    np.maximum.at(used, node[node >= 0], k[node >= 0])
    leaf = np.ones(levels.end.size, dtype=bool)
    leaf[levels.parent[levels.parent >= 0]] = False
    end = np.where(leaf, np.minimum(levels.end, used), levels.end)
    gone = end <= levels.start
    if not gone.any():
        return Levels(levels.parent, levels.start, end), node
    index = np.cumsum(~gone) - 1
    remap = np.where(gone, levels.parent, np.arange(gone.size))  # a gone node's prompts: its parent
    node = np.where(node >= 0, remap[np.maximum(node, 0)], -1)
    node = np.where(node >= 0, index[np.maximum(node, 0)], -1)
    parent = levels.parent[~gone]
    parent = np.where(parent >= 0, index[np.maximum(parent, 0)], -1)
    return Levels(parent, levels.start[~gone], end[~gone]), node


def _shared(lengths_sorted: np.ndarray, e: np.ndarray, m: int) -> np.ndarray:
    """Per prompt, its longest prefix that m prompts share (itself among them): the most similar
    prompts sit around it in sorted order, so it is the largest over the windows of m sorted
    prompts that hold it of the least `e` inside the window; capped by its length."""
    n = lengths_sorted.size
    if m > n:
        return np.zeros(n, dtype=np.int64)
    inside = _window(e, m - 1, np.minimum)  # windows of prompts j .. j + m - 1
    pad = np.zeros(m - 1, dtype=inside.dtype)
    return np.minimum(_window(np.concatenate((pad, inside, pad)), m, np.maximum), lengths_sorted)


def _window(x: np.ndarray, width: int, op: np.ufunc) -> np.ndarray:
    """`op` (np.minimum or np.maximum) over every x[j : j + width]: windows doubled up to the
    largest power of two within `width`, then two overlapping ones joined (O(n log width))."""
    out, span = x, 1
    while 2 * span <= width:
        out = op(out[:-span], out[span:])
        span *= 2
    return out if span == width else op(out[: x.size - width + 1], out[width - span :])


def _run_starts(t: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Sorted positions that start a run of equal non-empty prefixes P_i[:t_i]."""
    same = (t[1:] == t[:-1]) & (e >= t[1:])
    return np.flatnonzero((t > 0) & np.concatenate(([True], ~same)))


def _runs(k: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Runs of equal non-empty prefixes P_i[:k_i] in sorted order: each prompt's run (-1 when
    k_i = 0), the runs' first positions, and the common prefix of consecutive runs."""
    starts = _run_starts(k, e)
    first = np.zeros(k.size, dtype=bool)
    first[starts] = True
    run = np.cumsum(first) - 1
    run[k == 0] = -1
    if starts.size < 2:
        return run, starts, np.zeros(0, dtype=np.int64)
    between = np.minimum.reduceat(np.concatenate((e, [0])), starts)[:-1]
    t = k[starts]
    return run, starts, np.minimum(between, np.minimum(t[:-1], t[1:]))


def _trie(t: np.ndarray, f: np.ndarray) -> tuple[Levels, np.ndarray]:
    """The compressed trie over sorted runs of prefixes of lengths `t` whose consecutive common
    prefixes are `f`: a node per distinct prefix, plus a branch node wherever two part inside a
    node. Returns the nodes (renumbered by end, so parents come first) and each run's node."""
    if not t.size:
        return _no_levels(), np.zeros(0, dtype=np.int64)
    ends: list[int] = []
    parents: list[int] = []
    node_of_run: list[int] = []
    stack: list[int] = []
    for length, shared in zip(t.tolist(), [0, *f.tolist()], strict=True):
        last = -1
        while stack and ends[stack[-1]] > shared:
            last = stack.pop()
        if 0 < shared and (ends[stack[-1]] if stack else 0) < shared:  # they part inside `last`
            parents.append(stack[-1] if stack else -1)
            ends.append(shared)
            parents[last] = len(ends) - 1
            stack.append(len(ends) - 1)
        if length > shared:
            parents.append(stack[-1] if stack else -1)
            ends.append(length)
            stack.append(len(ends) - 1)
        node_of_run.append(stack[-1])  # a run equal to an earlier one's prefix reuses its node
    end = np.array(ends, dtype=np.int64)
    order = np.argsort(end, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    parent = np.array(parents, dtype=np.int64)[order]
    parent = np.where(parent >= 0, rank[np.maximum(parent, 0)], -1)
    end = end[order]
    start = np.where(parent >= 0, end[np.maximum(parent, 0)], 0)
    return Levels(parent, start, end), rank[np.array(node_of_run, dtype=np.int64)]


def _no_levels() -> Levels:
    empty = np.zeros(0, dtype=np.int64)
    return Levels(empty, empty, empty)
