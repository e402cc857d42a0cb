"""Prefix deduplication: which shared prompt prefixes the prefill actor computes once.

D(L) is the number of distinct length-L prefixes (a prompt shorter than L counts as its whole
prompt). Sorting the prompts groups every shared prefix into a contiguous run, so with e_i the
length of the common prefix of neighbours i and i+1 in sorted order (infinite when identical),
D(L) = 1 + #{i : e_i < L} for every L at once. The chosen prefix length is the largest L with
D(L) <= B_prefill (D is non-decreasing in L). Prompts are encoded as 4-byte-per-token bytes so
the sort and the common-prefix search run at C speed.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

if array("i").itemsize != 4:  # pragma: no cover - every supported platform has 4-byte C ints
    raise ImportError("planner.dedup needs a 4-byte array('i')")


@dataclass
class PackedPrompts:
    """Prompts as sortable bytes (4 bytes per token) plus their token counts."""

    keys: list[bytes]
    lengths: np.ndarray

    @classmethod
    def pack(cls, token_lists: Sequence[Any]) -> PackedPrompts:
        keys = [
            t.astype(np.int32, copy=False).tobytes() if isinstance(t, np.ndarray) else array("i", t).tobytes()
            for t in token_lists
        ]
        lengths = np.fromiter((len(k) >> 2 for k in keys), dtype=np.int64, count=len(keys))
        return cls(keys, lengths)


@dataclass
class Dedup:
    """The chosen prefix length, the D(L) curve and the prefix groups."""

    prefix_length: int
    d_curve: np.ndarray  # d_curve[L] = D(L) for L = 0..longest prompt (D(0) = 1)
    group_of: np.ndarray  # prefix group id of each prompt (input order)
    group_prefix_tokens: np.ndarray  # tokens of each group's shared prefix
    lengths: np.ndarray  # prompt token counts (input order)

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


def _common_prefix(a: bytes, b: bytes) -> int:
    """Common prefix of two token strings, in tokens (first differing byte via big-int XOR).

    Measured against a numpy version comparing column blocks of the sorted pairs: no faster at
    16,384 prompts, so the simpler one stays."""
    n = min(len(a), len(b))
    diff = int.from_bytes(a[:n], "big") ^ int.from_bytes(b[:n], "big")
    return (8 * n - diff.bit_length()) // 32


def deduplicate(prompts: PackedPrompts, capacity: int) -> Dedup:
    """Choose the largest prefix length whose distinct prefixes fit `capacity` (B_prefill)."""
    keys, lengths = prompts.keys, prompts.lengths
    n = len(keys)
    longest = int(lengths.max()) if n else 0
    order = np.array(sorted(range(n), key=keys.__getitem__), dtype=np.int64)
    sorted_keys = [keys[i] for i in order]
    lcp = np.fromiter(
        map(_common_prefix, sorted_keys[:-1], sorted_keys[1:]), dtype=np.int64, count=max(n - 1, 0)
    )
    la, lb = lengths[order[:-1]], lengths[order[1:]]
    identical = (lcp == la) & (la == lb)
    e = np.where(identical, longest + 1, lcp)
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
    return Dedup(prefix_length, d_curve, group_of, group_prefix, lengths)
