"""Data parallelism for the learner: which samples a rank computes, and the collectives that make
its update the single-process one.

Each optimizer step's rows are split by prompt group (a group's prompt then still runs once), the
groups balanced by tokens. A rank weighs its micro-batches by the whole mini-batch's token and
sample counts, so the sum of the ranks' gradients is the single-process gradient, however the
rows were split; reduces of 64 MB buckets add them on rank 0, which alone steps the optimizer. At width 1 every method is a no-op and
no process group exists (the in-process executor, a lone rank). The backend follows the device:
gloo for CPU ranks, NCCL for CUDA ones, whose collectives take tensors on the rank's GPU only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from rlhfless.runtime.samples import Sample
from rlhfless.runtime.transfer import buckets, map_leaves


def split_rows(samples: list[Sample], rows: list[int], width: int) -> list[list[int]]:
    """`rows` in `width` parts, whole prompt groups each, the heaviest group first to the lightest
    part (tokens: prompt once, every response); each part in `rows` order."""
    groups: dict[str, list[int]] = {}
    for i in rows:
        groups.setdefault(samples[i].uid, []).append(i)
    cost = {
        uid: len(samples[idx[0]].prompt_ids) + sum(len(samples[i].response_ids) for i in idx)
        for uid, idx in groups.items()
    }
    parts: list[list[int]] = [[] for _ in range(width)]
    load = [0] * width
    for uid in sorted(groups, key=lambda u: (-cost[u], u)):
        k = min(range(width), key=lambda r: (load[r], r))
        parts[k] += groups[uid]
        load[k] += cost[uid]
    order = {i: n for n, i in enumerate(rows)}
    return [sorted(part, key=order.__getitem__) for part in parts]


def backend(device: torch.device | str) -> str:
    """The process group's backend for ranks on `device`."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


@dataclass(frozen=True)
class DataParallel:
    """Rank `rank` of `width` in the default process group (none at width 1), its collectives'
    tensors on `device` (the rank's models')."""

    rank: int = 0
    width: int = 1
    device: torch.device | str = "cpu"

    def rows(self, samples: list[Sample], rows: list[int]) -> list[int]:
        """This rank's share of `rows`."""
        return rows if self.width == 1 else split_rows(samples, rows, self.width)[self.rank]

    def step(
        self, optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], max_norm: float, share: bool
    ) -> float:
        """One optimizer step on every rank's gradients summed. Rank 0 alone keeps the optimizer's
        states: ranks 1.. live for one learning phase, and handing them Adam's states (twice the
        weights) on joining would cost more than it saves. The sum lands on rank 0, which clips and
        steps; when another update of the phase follows (`share`), the others take its new
        weights. Returns the clipped gradients' norm (rank 0's; 0 on the others)."""
        if self.width > 1:
            self._sum_on_rank0(params)
        norm = 0.0
        if self.rank == 0:
            norm = float(torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_norm))
            optimizer.step()
        else:
            optimizer.zero_grad(set_to_none=True)
        if share and self.width > 1:
            broadcast_tensors([p.data for p in params])
        return norm

    def _sum_on_rank0(self, params: list[torch.nn.Parameter]) -> None:
        """Every rank's gradients of `params` summed into rank 0's. A parameter that some rank has a
        gradient for gets one (zeros where a rank had none); one that no rank has stays without,
        as it would in one process (the optimizer skips it)."""
        has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=self.device)
        dist.all_reduce(has)
        params = [p for p, n in zip(params, has.tolist(), strict=True) if n]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        for bucket in buckets([p.grad for p in params]):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.reduce(flat, 0)
            if self.rank == 0:
                _unflatten(flat, bucket)

    def reduce_sums(self, sums: dict[str, float]) -> dict[str, float]:
        """Every rank's metric sums added up (sums weighted by whole-batch shares add to its means)."""
        if self.width == 1:
            return sums
        keys = sorted(sums)
        values = torch.tensor([sums[k] for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(values)
        return dict(zip(keys, values.tolist(), strict=True))

    def merge(self, per_sample: list[Tensor], mine: list[int]) -> list[Tensor]:
        """Per-sample tensors of which this rank filled rows `mine`, completed from the others."""
        if self.width == 1:
            return per_sample
        parts: list[list[tuple[int, Tensor]] | None] = [None] * self.width
        dist.all_gather_object(parts, [(i, per_sample[i]) for i in mine])
        out = list(per_sample)
        for part in parts:
            for i, value in part:
                out[i] = value
        return out


def _unflatten(flat: Tensor, tensors: list[Tensor]) -> None:
    """Copy `flat` back into `tensors`, in order."""
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def broadcast_tensors(tensors: list[Tensor], src: int = 0) -> None:
    """`src`'s `tensors` into every rank's, in place, a 64 MB bucket at a time."""
    with torch.no_grad():
        for bucket in buckets(tensors):
            flat = torch.cat([t.reshape(-1) for t in bucket])
            dist.broadcast(flat, src)
            _unflatten(flat, bucket)


def everyone(flag: bool, device: torch.device | str = "cpu") -> bool:
    """Whether `flag` holds on every rank of the default process group (one small reduce)."""
    held = torch.tensor([int(flag)], device=device)
    dist.all_reduce(held, op=dist.ReduceOp.MIN)
    return bool(held.item())


def broadcast_params(module: torch.nn.Module, src: int = 0) -> None:
    """`src`'s parameters into every rank's `module`."""
    broadcast_tensors([p.data for p in module.parameters()], src)


def broadcast_state(state: dict | None, src: int = 0, device: torch.device | str = "cpu") -> dict:
    """`src`'s state dict (an optimizer's, a scheduler's: nested dicts and lists with tensors) on
    every rank: its layout as one object, then each tensor as a tensor, not pickled. Each tensor
    travels on `device` (NCCL's GPU) and lands where it was on `src` (Adam keeps its step count
    on the CPU)."""
    tensors: list[Tensor] = []

    def strip(leaf):
        if not isinstance(leaf, Tensor):
            return leaf
        tensors.append(leaf.contiguous().to(device))
        return _Slot(len(tensors) - 1, tuple(leaf.shape), leaf.dtype, leaf.device.type == "cpu")

    def allocate(leaf):
        if isinstance(leaf, _Slot):
            tensors.append(torch.empty(leaf.shape, dtype=leaf.dtype, device=device))
        return leaf

    layout = [map_leaves(state, strip) if dist.get_rank() == src else None]
    dist.broadcast_object_list(layout, src)
    if dist.get_rank() != src:
        map_leaves(layout[0], allocate)
    for tensor in tensors:
        dist.broadcast(tensor, src)
    return map_leaves(
        layout[0], lambda leaf: _land(tensors[leaf.index], leaf) if isinstance(leaf, _Slot) else leaf
    )


@dataclass(frozen=True)
class _Slot:
    """Where a tensor sits in a broadcast state's layout."""

    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    on_cpu: bool  # where it was on the source rank: the CPU, or the rank's own device


def _land(tensor: Tensor, slot: _Slot) -> Tensor:
    return tensor.cpu() if slot.on_cpu else tensor
