"""Preparation overlapped with the generation tail, strictly on-policy.

A group can be scored and its reference (and, for PPO, critic) forward run as soon as all of its
samples have finished: the forward only reads the finished samples and the reference weights, so
running it early changes no sample, reward, advantage or update. It runs on the GPUs that the
decode actors no longer hold: those the plan never used, and each released actor's, once the
reference weights have reached them. The decode actors are never slowed. What is left when
generation ends runs on every GPU as before. The work is a fluid: a forward over many sequences
splits across any number of GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rlhfless.planner.pricing import Pricing, charge


@dataclass(frozen=True)
class FreeGpus:
    """GPUs that can take preparation work from `ready_s` on, after `load_s` of loading the
    reference weights (billed when they are used)."""

    ready_s: float
    gpus: float
    load_s: float


@dataclass(frozen=True)
class Overlap:
    """How much preparation ran during generation, what is left after it, and its bill."""

    done_gpu_s: float  # preparation GPU-seconds run during generation
    left_gpu_s: float  # what is left for every GPU after generation
    billed: float = 0.0  # USD: the overlapped work and the weight loads of the GPUs that ran it


def overlap_preparation(
    group_finish: np.ndarray,
    group_work_gpu_s: np.ndarray,
    free: Sequence[FreeGpus],
    generation_end: float,
    pricing: Pricing,
) -> Overlap:
    """Run each group's preparation (GPU-seconds) from its finish on the GPUs `free` offers until
    `generation_end`, earliest-finished groups first."""
    finish = np.asarray(group_finish, dtype=float)
    work = np.asarray(group_work_gpu_s, dtype=float)
    times = {0.0, generation_end, *finish[finish < generation_end].tolist(), *(f.ready_s for f in free)}
    events = sorted(t for t in times if 0.0 <= t <= generation_end)
    done, last_busy = 0.0, -1.0
    for start, end in zip(events, events[1:], strict=False):
        gpus = sum(f.gpus for f in free if f.ready_s <= start)
        ready = float(work[finish <= start].sum())
        step = min(ready, done + gpus * (end - start)) - done
        if step > 0:
            done, last_busy = done + step, start
    loads = sum(f.gpus * f.load_s for f in free if f.ready_s <= last_busy)
    billed = charge(pricing, 1.0, done + loads) if done > 0 else 0.0
    return Overlap(done, float(work.sum()) - done, billed)
