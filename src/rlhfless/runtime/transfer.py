"""Weights and prefix KV as flat numpy buffers, so the Ray object store hands them out zero-copy,
and the record every transfer leaves.

A pickled state dict costs seconds to serialise and copy; one contiguous numpy array is put once
per weight version and read by every function on the node straight from shared memory (bfloat16
travels as int16 bits). Prefix KV caches of a step travel the same way: one put, one array each.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from rlhfless.engine.kv import PrefixKV
from rlhfless.engine.weights import copy_into_parameters


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view (or CPU copy) of `tensor`; bfloat16 as its int16 bit pattern."""
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy()
    return tensor.numpy()


def from_numpy(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A tensor sharing `array`'s memory (read-only object-store buffers included)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only buffer: we never write to it
        tensor = torch.from_numpy(array)
    return tensor.view(torch.bfloat16) if dtype == torch.bfloat16 else tensor


BUCKET_ELEMENTS = 1 << 24  # 64 MB of fp32: what one collective of the learner's ranks carries


def buckets(tensors: list[torch.Tensor], elements: int = BUCKET_ELEMENTS) -> list[list[torch.Tensor]]:
    """`tensors` in order, cut into runs of at most `elements` (a larger one alone)."""
    out: list[list[torch.Tensor]] = [[]]
    size = 0
    for t in tensors:
        if out[-1] and size + t.numel() > elements:
            out.append([])
            size = 0
        out[-1].append(t)
        size += t.numel()
    return [b for b in out if b]


def map_leaves(node, leaf_fn):
    """`node` rebuilt with `leaf_fn` applied to every leaf of its dicts, lists and tuples, in order."""
    if isinstance(node, dict):
        return {k: map_leaves(v, leaf_fn) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return type(node)(map_leaves(v, leaf_fn) for v in node)
    return leaf_fn(node)


def flat_weights(model: torch.nn.Module) -> np.ndarray:
    """All parameters in `model.parameters()` order, as one contiguous array."""
    with torch.no_grad():
        return to_numpy(torch.nn.utils.parameters_to_vector(model.parameters()))


def load_flat_weights(model: torch.nn.Module, flat: np.ndarray) -> None:
    """Copy a `flat_weights` buffer into `model` (same architecture, same parameter order)."""
    copy_into_parameters(model, from_numpy(flat, next(model.parameters()).dtype))


@dataclass(frozen=True)
class Transfer:
    """One move of weights, prefix KV or sequence state to a function: what, how much, how long,
    and whether it stayed inside a node (there, the object store shares memory: no copy)."""

    kind: str  # weights, kv, migration, rerun
    source: str  # function name (learner, decode-3, ...)
    target: str
    bytes: int
    seconds: float
    same_node: bool
    start: float


@dataclass
class KVBundle:
    """The prefix tree's KV of one step, each level once: `arrays[i]` is [2, layers, heads, n, dim]
    for node i's own `tokens[i]`, which follow its parent's (`parents[i]`, -1 at the root)."""

    tokens: list[list[int]]
    parents: list[int]
    arrays: list[np.ndarray]
    weight_version: int
    bfloat16: bool

    @classmethod
    def pack(cls, prefixes: list[PrefixKV], parents: list[int]) -> KVBundle:
        """From each node's whole-prefix KV (`Engine.prefill`), keeping only its own part."""
        starts = [len(prefixes[p]) if p >= 0 else 0 for p in parents]
        arrays = [
            to_numpy(torch.stack((torch.stack(p.keys), torch.stack(p.values)))[:, :, :, s:])
            for p, s in zip(prefixes, starts, strict=True)
        ]
        tokens = [list(p.token_ids[s:]) for p, s in zip(prefixes, starts, strict=True)]
        version = prefixes[0].weight_version if prefixes else 0
        bf16 = bool(prefixes) and prefixes[0].keys[0].dtype == torch.bfloat16
        return cls(tokens, list(parents), arrays, version, bf16)

    def path(self, index: int) -> list[int]:
        """Node `index` and its ancestors, root first."""
        out = []
        while index >= 0:
            out.append(index)
            index = self.parents[index]
        return out[::-1]

    def get(self, index: int) -> PrefixKV:
        """Node `index`'s whole prefix as a PrefixKV: its levels joined (a root's child views the
        bundle's memory)."""
        dtype = torch.bfloat16 if self.bfloat16 else torch.float32
        path = self.path(index)
        parts = [from_numpy(self.arrays[i], dtype) for i in path]
        kv = parts[0] if len(parts) == 1 else torch.cat(parts, dim=3)
        tokens = [t for i in path for t in self.tokens[i]]
        return PrefixKV(tokens, list(kv[0].unbind(0)), list(kv[1].unbind(0)), self.weight_version)

    def nbytes(self, indices: set[int]) -> int:
        """Bytes of the levels these nodes' prefixes are made of, each once."""
        return sum(int(self.arrays[i].nbytes) for i in {i for j in indices for i in self.path(j)})
