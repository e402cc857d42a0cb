"""Prefix deduplication: the step's prompts in sorted order with the common prefix of sorted
neighbours, and from them what the prefill actor computes once (`planner.prefix_tree`: the
paper's D(L) rule or a prefix tree).

Sorting the prompts groups every shared prefix into a contiguous run, so with e_i the length of
the common prefix of neighbours i and i+1 in sorted order (longest + 1 when identical) every
prefix count, and the step's unique tokens, is a histogram or a sum over e.

The sort is most-significant-chunk first, in numpy: the prompts' first `FIRST_CHUNK` tokens are
sorted as rows of token id + 1 (zero past the end), and only prompts still tied with a
neighbour read their next chunk (twice as long), and so on. Tokens past the
point where a prompt differs from every other are never read, which matters when prompts come
as Python lists (a tokenizer's output): converting an int costs more than comparing it. A list
at most `WHOLE_READ` first chunks long is read whole in the first round all the same: slicing
it costs more than reading the rest (`_first_reads`).
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter, getitem
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from rlhfless.planner import prefix_tree
from rlhfless.planner.ordering import lex_order
from rlhfless.planner.prefix_tree import Levels

FIRST_CHUNK = 64  # tokens per prompt read in the first round (then 2x, 4x, ... for ties)
WHOLE_READ = 3  # a Python list at most this many first chunks long is read whole in one go
PACKED_COLUMNS = 8  # rows of at most this many varying columns sort as bit-packed uint64 keys


@dataclass
class PackedPrompts:
    """The prompts' lengths, their lexicographic order (stable: identical prompts keep input
    order) and `lcp`, the common prefix of sorted neighbours i, i+1 (longest prompt + 1 when
    identical): all that deduplication needs of the tokens.

    Token ids must be integers in [0, 2**32 - 1) (else ValueError). In Python lists, a token
    past the chunk where its prompt differs from every other is never read, so never checked,
    since it cannot change the plan (`rlhfless plan` checks its prompt files in full)."""

    lengths: np.ndarray
    order: np.ndarray
    lcp: np.ndarray

    @classmethod
    def pack(cls, token_lists: Sequence[Any], first_chunk: int = FIRST_CHUNK) -> PackedPrompts:
        lengths = np.fromiter(map(len, token_lists), dtype=np.int64, count=len(token_lists))
        n = lengths.size
        longest = int(lengths.max()) if n else 0
        order = np.arange(n)
        lcp = np.full(max(n - 1, 0), longest + 1, dtype=np.int64)
        # Sorted positions still tied with a neighbour, and the run of equal rows each is in.
        tied, run = np.arange(n), np.zeros(n, dtype=np.int64)
        reader = _TokenReader(token_lists, lengths, first_chunk)
        depth, chunk = 0, first_chunk
        while tied.size > 1 and depth < longest:
            rows = order[tied]
            keys = reader.keys(rows, depth, chunk)
            # Columns equal in every row (a shared system prompt) cannot order or split rows.
            cols = np.flatnonzero((keys != keys[0]).any(axis=0))
            varying = keys[:, cols]
            perm = _stable_rank(run, varying)
            order[tied] = rows[perm]
            varying = varying[perm]
            same_run = run[1:] == run[:-1]  # neighbours in sorted order, equal through `depth`
            differs = varying[1:] != varying[:-1]
            split = differs.any(axis=1)
            if cols.size:
                at = tied[:-1][same_run & split]
                lcp[at] = depth + cols[differs[same_run & split].argmax(axis=1)]
            # Equal through the chunk and ended inside it: identical (lcp stays longest + 1).
            still = same_run & ~split & (keys[perm[1:], -1] != 0)
            member = np.zeros(tied.size, dtype=bool)
            member[:-1] |= still
            member[1:] |= still
            run = np.cumsum(np.r_[True, ~still])[member]
            tied = tied[member]
            depth, chunk = depth + chunk, 2 * chunk
        return cls(lengths, order, lcp)


def _stable_rank(run: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """Stable order of rows by `run` (integers >= 0), then lexicographically by the rows of
    `columns` (integers in [0, 2**32)). The run and a few columns are packed into uint64 keys,
    as many to a key as their bit widths allow; more columns are sorted at once as big-endian
    byte strings."""
    if columns.shape[1] > PACKED_COLUMNS:
        ranked = np.ascontiguousarray(np.column_stack((run >> 32, run & 0xFFFFFFFF, columns)), ">u4")
        return np.argsort(ranked.view(f"V{4 * ranked.shape[1]}").ravel(), kind="stable")
    keys, used = [np.zeros(run.size, dtype=np.uint64)], 0
    for field in (run, *columns.T):
        bits = int(field.max()).bit_length()
        if used + bits > 64:
            keys.append(np.zeros_like(keys[0]))
            used = 0
        keys[-1] <<= np.uint64(bits)
        keys[-1] |= field.astype(np.uint64)
        used += bits
    return lex_order(keys[::-1])


class _TokenReader:
    """Windows [depth, depth + width) of chosen prompts' tokens as key rows (token id + 1, zero
    past the end), cut from `flat`, the prompts end to end (`starts`; `stored`: the tokens held of
    each, None where every prompt is held whole). Numpy arrays of one dtype are joined as bytes
    (anything else is concatenated) and checked once. Python lists (a tokenizer's output) are
    read in C (`_read_ids`): `_first_reads` holds the first chunk of each, and a window past what
    is held is sliced from the lists and read then. What `_read_ids` refuses is read again by the
    checked reader, which names it, in the windows asked for only."""

    def __init__(self, token_lists: Sequence[Any], lengths: np.ndarray, first_chunk: int) -> None:
        self.lengths = lengths
        kinds = set(map(type, token_lists))
        self.lists = token_lists if kinds == {list} else None
        if self.lists is not None:
            first = _first_reads(self.lists, lengths, first_chunk)
            self.flat, self.starts, self.stored = first if first else (None, None, None)
            return
        rows = list(itertools.compress(token_lists, lengths))
        if kinds != {np.ndarray}:
            rows = list(map(np.asarray, rows))
        longest = int(lengths.max()) if lengths.size else 0
        # Zeros after the last prompt: a window may run past it (what it reads there is cut).
        self.flat = _checked(_joined(rows, longest))
        self.starts = np.cumsum(lengths) - lengths
        self.stored = None

    def keys(self, rows: np.ndarray, depth: int, width: int) -> np.ndarray:
        lengths = self.lengths[rows]
        counts = np.clip(lengths - depth, 0, width)
        full = counts.min() == width  # every window inside its prompt: no cut to make
        in_flat = self.flat is not None and (
            self.stored is None or bool((self.stored[rows] >= np.minimum(lengths, depth + width)).all())
        )
        if in_flat:  # each row's window of the concatenation, cut at the row's end
            span = min(width, self.flat.size - int(self.starts[rows].max()) - depth)
            window = sliding_window_view(self.flat, span)[self.starts[rows] + depth]
            window = window.astype(np.uint32, copy=False)
            window += 1
            if full and span == width:
                return window
            window[np.arange(span) >= counts[:, None]] = 0
            keys = np.zeros((rows.size, width), dtype=np.uint32)
            keys[:, :span] = window
            return keys
        lists = self.lists if depth == 0 else list(map(self.lists.__getitem__, rows.tolist()))
        tokens = _read_ids(map(getitem, lists, itertools.repeat(slice(depth, depth + width))))
        if tokens is None:
            tokens = _checked(_read_windows(lists, depth, width, int(counts.sum())))
        tokens = tokens.astype(np.uint32, copy=False)
        tokens += 1
        if full:  # the tokens are the rows, end to end
            return tokens.reshape(rows.size, width)
        keys = np.zeros((rows.size, width), dtype=np.uint32)
        keys[np.arange(width) < counts[:, None]] = tokens
        return keys


def _first_reads(
    lists: Sequence[list[Any]], lengths: np.ndarray, width: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The first round's tokens of Python lists, end to end (then zeros), with each
    one's start and the tokens stored: a list at most `WHOLE_READ * width` long whole, since
    `fromlist` reads a list in place (~3 ns a token here) but a slice first copies it, touching
    every int twice (~10 ns a token); a longer one's first `width`. None where `fromlist`
    refuses an item or an id is 2**32 - 1: the first round then reads its windows as later ones
    do, checked."""
    whole = lengths <= WHOLE_READ * width
    stored = np.where(whole, lengths, width)
    cut = itertools.repeat(slice(0, width))
    heads = map(getitem, itertools.compress(lists, (~whole).tolist()), cut)
    # Zeros after the last prompt, as many as the longest held: a later round's window over a
    # whole prompt may run that far past the last one's start (what it reads there is cut).
    flat = _read_ids(
        itertools.chain(itertools.compress(lists, whole.tolist()), heads), int(stored.max(initial=0))
    )
    if flat is None:
        return None
    starts = np.empty_like(lengths)
    starts[whole] = np.cumsum(lengths[whole]) - lengths[whole]
    starts[~whole] = int(lengths[whole].sum()) + width * np.arange(lengths.size - int(whole.sum()))
    return flat, starts, stored


def _read_ids(lists: Iterable[list[Any]], zeros: int = 0) -> np.ndarray | None:
    """`lists` end to end (then `zeros` zeros) as unsigned ints, read in C by `array.fromlist`,
    which takes only integers (a float, a string or None is a TypeError, a negative id or one
    past 2**32 - 1 an OverflowError). None where it refuses an item or an id is 2**32 - 1 (its
    key, id + 1, would wrap): the checked reader then reads the windows asked for, and names it."""
    read = array("I")
    try:
        any(map(read.fromlist, lists))
    except (TypeError, ValueError, OverflowError):
        return None
    read.frombytes(bytes(zeros * read.itemsize))
    ids = np.frombuffer(read, dtype=f"u{read.itemsize}")
    return None if ids.size and ids.max() >= 2**32 - 1 else ids


def _joined(rows: list[np.ndarray], zeros: int) -> np.ndarray:
    """`rows` end to end, then `zeros` zeros: as bytes when all are contiguous 1-d arrays of one
    dtype (no per-row conversion), else by `np.concatenate` in their common dtype."""
    if (
        len(set(map(attrgetter("dtype", "ndim"), rows))) == 1
        and rows[0].ndim == 1
        and rows[0].dtype.kind in "iu"
    ):
        dtype = rows[0].dtype
        try:
            return np.frombuffer(b"".join([*rows, bytes(zeros * dtype.itemsize)]), dtype)
        except (BufferError, TypeError):  # a non-contiguous view
            pass
    dtype = np.result_type(*rows) if rows else np.int64
    return np.concatenate((*rows, np.zeros(zeros, dtype=dtype)))


def _read_windows(lists: list[list[Any]], depth: int, width: int, total: int) -> np.ndarray:
    """Items [depth, depth + width) of each list, end to end, as int64 (`total` of them)."""

    def windows() -> Any:
        return map(itertools.islice, lists, itertools.repeat(depth), itertools.repeat(depth + width))

    try:
        checked = sum(map(sum, windows()))
    except TypeError:
        checked = None
    if not isinstance(checked, int | np.integer):
        raise ValueError("prompt_tokens: got a non-integer value, expected integer token ids")
    try:
        return np.fromiter(itertools.chain.from_iterable(windows()), dtype=np.int64, count=total)
    except OverflowError:
        raise ValueError(
            "prompt_tokens: got a token id beyond 64 bits, expected ids in [0, 2**32 - 1)"
        ) from None


def _checked(flat: np.ndarray) -> np.ndarray:
    if flat.dtype.kind not in "iu":
        raise ValueError(f"prompt_tokens: got {flat.dtype} values, expected integer token ids")
    if flat.size and (flat.min() < 0 or flat.max() >= 2**32 - 1):
        bad = int(flat.min()) if flat.min() < 0 else int(flat.max())
        raise ValueError(f"prompt_tokens: got token id {bad}, expected ids in [0, 2**32 - 1)")
    return flat


@dataclass
class Dedup:
    """Which prompt tokens the prefill actor computes (the levels of a prefix tree, each once) and
    which each prompt's decode actor still computes (the rest, once, shared by its samples)."""

    rule: str  # tree or paper (`planner.prefix_tree`)
    prefix_length: int  # no prompt receives more KV than this (paper: the chosen L)
    d_curve: np.ndarray  # paper: d_curve[L] = D(L) for L = 0..longest (tree: empty)
    node_of: np.ndarray  # per prompt (input order): the node whose KV it starts from, -1: none
    prefix_tokens: np.ndarray  # per prompt: tokens it receives as KV (at most its length - 1)
    levels: Levels
    lengths: np.ndarray  # prompt token counts (input order)
    unique_tokens: int = 0  # tokens of the step's prefix tree: each shared prefix counted once

    @property
    def remaining_tokens(self) -> np.ndarray:
        """Per prompt: tokens its decode actor still prefills (once, shared by its samples)."""
        return self.lengths - self.prefix_tokens

    def tokens(self, group_size: int) -> dict[str, int]:
        """Prompt tokens computed without any dedup, per prompt only, and with prefix dedup."""
        total = int(self.lengths.sum())
        return {
            "naive": total * group_size,
            "per_prompt": total,
            "dedup": self.levels.tokens + int(self.remaining_tokens.sum()),
        }

    def layout(self, uids: Sequence[str]) -> tuple[list[list[str]], list[dict[str, int]]]:
        """The plan's `prefix_groups` (the uids starting from each node, largest group first,
        ties by first uid) and `prefix_tree` (per node, parents first: its parent, its tokens
        [start, end) and its group, -1 for a branch node no prompt starts from)."""
        has = np.flatnonzero(self.node_of >= 0)
        order = has[np.argsort(self.node_of[has], kind="stable")]
        nodes = self.node_of[order]
        cuts = np.flatnonzero(np.diff(nodes)) + 1
        names = np.asarray(uids, dtype=object)[order].tolist()
        bounds = np.r_[0, cuts, order.size].tolist()
        groups = [names[a:b] for a, b in itertools.pairwise(bounds)] if order.size else []
        rank = sorted(range(len(groups)), key=lambda j: (-len(groups[j]), groups[j][0]))
        group_of_node = np.full(self.levels.end.size, -1)
        if order.size:
            group_of_node[nodes[np.r_[0, cuts]]] = np.argsort(rank)
        tree = [
            {"parent": p, "start": s, "end": e, "group": g}
            for p, s, e, g in zip(
                self.levels.parent.tolist(),
                self.levels.start.tolist(),
                self.levels.end.tolist(),
                group_of_node.tolist(),
                strict=True,
            )
        ]
        return [groups[j] for j in rank], tree


def _tree_tokens(lengths_sorted: np.ndarray, e: np.ndarray) -> int:
    """Tokens of the prefix tree over sorted prompts: each one's tokens past its shared prefix."""
    return int(lengths_sorted.sum() - np.minimum(e, lengths_sorted[1:]).sum())


def tree_tokens(prompts: PackedPrompts) -> int:
    """Unique prompt tokens of the step (a prefix tree's): the least prefill that computes all."""
    return _tree_tokens(prompts.lengths[prompts.order], prompts.lcp)


def deduplicate(prompts: PackedPrompts, capacity: int, rule: str = "tree") -> Dedup:
    """The shared prefixes the prefill actor computes under `rule` (`planner.prefix_tree`), with
    at most `capacity` (B_prefill) of them."""
    lengths, order, e = prompts.lengths, prompts.order, prompts.lcp
    sorted_lengths = lengths[order]
    rules = {"tree": prefix_tree.tree, "paper": prefix_tree.paper}
    if rule not in rules:
        raise ValueError(f"prefix_rule: got {rule!r}, expected one of {', '.join(rules)}")
    shared = rules[rule](sorted_lengths, e, capacity)
    node_of = np.empty_like(shared.node)
    node_of[order] = shared.node
    k = np.empty_like(shared.k)
    k[order] = shared.k
    unique = _tree_tokens(sorted_lengths, e) if lengths.size else 0
    return Dedup(rule, shared.deepest, shared.curve, node_of, k, shared.levels, lengths, unique)
