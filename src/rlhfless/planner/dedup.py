"""Prefix deduplication: which shared prompt prefixes the prefill actor computes once.

D(L) is the number of distinct length-L prefixes (a prompt shorter than L counts as its whole
prompt). Sorting the prompts groups every shared prefix into a contiguous run, so with e_i the
length of the common prefix of neighbours i and i+1 in sorted order (infinite when identical),
D(L) = 1 + #{i : e_i < L} for every L at once. The chosen prefix length is the largest L with
D(L) <= B_prefill (D is non-decreasing in L). Prompts are the rows of one padded matrix, so the
lexicographic sort (rows viewed as byte strings) and the common-prefix search (first column where
sorted neighbours differ) both run in numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class PackedPrompts:
    """Prompts as rows of one matrix of token id + 1, zero past each prompt's end (zero differs
    from every token), stored big-endian so that a row's bytes sort as its token string.

    Memory is prompts x longest prompt x 4 bytes: the price of sorting and comparing in numpy."""

    keys: np.ndarray  # (prompts, max(longest prompt, 1)), dtype >u4
    lengths: np.ndarray

    @classmethod
    def pack(cls, token_lists: Sequence[Any]) -> PackedPrompts:
        lengths = np.fromiter(map(len, token_lists), dtype=np.int64, count=len(token_lists))
        rows = [t for t in token_lists if len(t)]
        flat = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
        if flat.dtype.kind not in "iu":
            raise ValueError(f"prompt_tokens: got {flat.dtype} values, expected integer token ids")
        if flat.size and (flat.min() < 0 or flat.max() >= 2**32 - 1):
            bad = int(flat.min()) if flat.min() < 0 else int(flat.max())
            raise ValueError(f"prompt_tokens: got token id {bad}, expected ids in [0, 2**32 - 1)")
        width = max(int(lengths.max()) if lengths.size else 0, 1)
        keys = np.zeros((lengths.size, width), dtype=">u4")
        keys[np.arange(width) < lengths[:, None]] = flat + 1
        return cls(keys, lengths)


@dataclass
class Dedup:
    """The chosen prefix length, the D(L) curve and the prefix groups."""

    prefix_length: int
    d_curve: np.ndarray  # d_curve[L] = D(L) for L = 0..longest prompt (D(0) = 1)
    group_of: np.ndarray  # prefix group id of each prompt (input order)
    group_prefix_tokens: np.ndarray  # tokens of each group's shared prefix
    lengths: np.ndarray  # prompt token counts (input order)
    unique_tokens: int = 0  # tokens of the step's prefix tree: each shared prefix counted once

    @property
    def n_groups(self) -> int:
        return int(self.group_prefix_tokens.size)

    @property
    def prefix_tokens(self) -> np.ndarray:
        """Per prompt: tokens it gets from the prefill actor."""
        return np.minimum(self.lengths, self.prefix_length)

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
            "dedup": int(self.group_prefix_tokens.sum() + self.remaining_tokens.sum()),
        }

    def groups(self, uids: Sequence[str]) -> list[list[str]]:
        """Each unique prefix's uids, largest group first (ties by first uid)."""
        order = np.argsort(self.group_of, kind="stable")
        cuts = np.flatnonzero(np.diff(self.group_of[order])) + 1
        groups = [[uids[i] for i in part] for part in np.split(order, cuts)] if order.size else []
        return sorted(groups, key=lambda g: (-len(g), g[0]))


def _sorted_prefixes(prompts: PackedPrompts) -> tuple[np.ndarray, np.ndarray]:
    """Lexicographic order of the prompts and e_i, the common prefix of sorted neighbours i, i+1
    (longest prompt + 1 when identical)."""
    keys, lengths = prompts.keys, prompts.lengths
    longest = int(lengths.max()) if lengths.size else 0
    order = np.argsort(keys.view(f"V{keys.itemsize * keys.shape[1]}").ravel(), kind="stable")
    ranked = keys[order]
    differs = ranked[1:] != ranked[:-1]
    # the first differing column is the common prefix; no differing column: identical prompts
    return order, np.where(differs.any(axis=1), differs.argmax(axis=1), longest + 1)


def _tree_tokens(lengths_sorted: np.ndarray, e: np.ndarray) -> int:
    """Tokens of the prefix tree over sorted prompts: each one's tokens past its shared prefix."""
    return int(lengths_sorted.sum() - np.minimum(e, lengths_sorted[1:]).sum())


def tree_tokens(prompts: PackedPrompts) -> int:
    """Unique prompt tokens of the step (a prefix tree's): the least prefill that computes all."""
    order, e = _sorted_prefixes(prompts)
    return _tree_tokens(prompts.lengths[order], e)


def deduplicate(prompts: PackedPrompts, capacity: int) -> Dedup:
    """Choose the largest prefix length whose distinct prefixes fit `capacity` (B_prefill)."""
    lengths = prompts.lengths
    n = lengths.size
    longest = int(lengths.max()) if n else 0
    order, e = _sorted_prefixes(prompts)
    # D(L) = 1 + #{e_i < L} = 1 + #{e_i <= L - 1}
    hist = np.bincount(e, minlength=longest + 2)
    d_curve = np.concatenate(([1], 1 + np.cumsum(hist[:longest]))) if n else np.ones(1, dtype=np.int64)
    fits = np.flatnonzero(d_curve[1:] <= capacity)
    prefix_length = int(fits[-1] + 1) if fits.size else 0
    if prefix_length == 0:
        group_sorted = np.arange(n)
    else:
        breaks = np.concatenate(([0], (e < prefix_length).astype(np.int64)))
        group_sorted = np.cumsum(breaks)
    group_of = np.empty(n, dtype=np.int64)
    group_of[order] = group_sorted
    n_groups = int(group_sorted[-1] + 1) if n else 0
    group_prefix = np.zeros(n_groups, dtype=np.int64)
    group_prefix[group_sorted] = np.minimum(lengths[order], prefix_length)
    unique = _tree_tokens(lengths[order], e) if n else 0
    return Dedup(prefix_length, d_curve, group_of, group_prefix, lengths, unique)
