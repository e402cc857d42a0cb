"""The generation floor: how fast and how cheap a step's generation could possibly be.

No schedule beats either of two bounds, both read from the profile:
- latency: the longest sequence decoded alone (batch 1) from its prompt, token by token;
- throughput: every decode token at the best tokens/s one actor reaches within what its KV memory
  and engine batch limit allow, on every actor the cluster holds. An actor's batch is also bounded
  by the sequences there are: the step's N sequences shared by A actors run at most N / A each
  (tokens/s is concave in the batch, so an even share is the best split; fewer actors only lower
  the total rate).
The floor is the larger. Cost has its own floor, the work floor: the decode tokens' GPU-seconds at
the best throughput one actor reaches with every sequence it could hold, plus one prefill of every unique prompt token (a prefix tree's tokens), priced
by `pricing.charge`. A policy's generation time and cost over these say how much a schedule can
still win. Given several actor shapes (tensor-parallel sizes), each bound takes the best of them.

Contexts: a sequence of prompt p and response L generates its tokens at contexts p .. p + L - 1,
so the token-weighted mean context is sum L (p + (L - 1) / 2) / sum L. Decode-step time is linear
in context inside a profile cell, so the bound at the mean context is the bound of the mean step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from rlhfless.planner.pricing import Pricing, charge
from rlhfless.planner.profile import Profile


@dataclass(frozen=True)
class Floor:
    """One step's generation floor (seconds) and work floor (GPU-seconds, USD)."""

    latency_s: float
    throughput_s: float
    work_gpu_s: float
    work_cost: float
    tokens_per_s: float  # best decode throughput of one actor of the best shape
    batch: int  # the batch that reaches it
    gpus: int  # GPUs per actor of that shape
    actors: int = 1  # actors of the shape setting the throughput bound that the cluster holds

    @property
    def time_s(self) -> float:
        return max(self.latency_s, self.throughput_s)

    def ratios(self, time_s: float, cost: float) -> dict[str, float]:
        """A policy's generation time over the floor and its generation cost over the work floor."""
        return {
            "time_over_floor": time_s / self.time_s if self.time_s > 0 else 1.0,
            "cost_over_floor": cost / self.work_cost if self.work_cost > 0 else 1.0,
        }

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "time_s": self.time_s}


def best_throughput(profile: Profile, context: float, sequences: float = np.inf) -> tuple[float, int]:
    """(tokens/s, batch) of the fastest-decoding batch at `context` that the actor may run.

    Step time is linear in batch between profile points, so batch / step peaks at a point or at
    the cap (KV memory at `context` tokens a sequence, the engine's batch limit, the `sequences`
    it can be given)."""
    cap = max(1, int(min(profile.concurrency(context), sequences)))
    grid = profile.decode_batch[profile.decode_batch <= cap].astype(np.int64)
    batches = np.unique(np.r_[grid, cap, 1])
    step = profile.decode_step_seconds(batches, context)
    rate = batches / np.maximum(step, 1e-12)
    best = int(np.argmax(rate))
    return float(rate[best]), int(batches[best])


def generation_floor(
    shapes: Sequence[tuple[Profile, int]],
    prompt_tokens: np.ndarray,
    lengths: np.ndarray,
    unique_prompt_tokens: float,
    pricing: Pricing,
    counts: np.ndarray | None = None,
) -> Floor:
    """The floor of decoding `lengths` after prompts of `prompt_tokens` (one each per sequence, or
    per kind of sequence with `counts` saying how many there are); `shapes`: (actor profile,
    actors of it the cluster holds), e.g. one per TP size."""
    if not shapes:
        raise ValueError("shapes: got none, expected at least one actor shape")
    p = np.asarray(prompt_tokens, dtype=float).ravel()
    n = np.asarray(lengths, dtype=float).ravel()
    k = np.ones_like(n) if counts is None else np.asarray(counts, dtype=float).ravel()
    n = np.where(k > 0, n, 0.0)
    tokens = float((k * n).sum())
    sequences = float(k[n > 0].sum())
    mean_prompt = float(p.mean()) if p.size else 1.0
    context = float((k * n * (p + (n - 1) / 2)).sum() / tokens) if tokens > 0 else mean_prompt
    latency, through, work = [], [], []
    rates: list[tuple[float, int, int]] = []
    for profile, actors in shapes:
        latency.append(float(np.max(n * profile.decode_step_seconds(1, p + (n - 1) / 2), initial=0.0)))
        shared, _ = best_throughput(profile, context, math.ceil(sequences / max(actors, 1)))
        through.append(tokens / (shared * max(actors, 1)))
        rate, batch = best_throughput(profile, context, sequences)
        work.append(profile.gpus * (tokens / rate + float(profile.prefill_seconds(unique_prompt_tokens))))
        rates.append((rate, batch, profile.gpus))
    cheapest = int(np.argmin(work))
    rate, batch, gpus = rates[cheapest]
    cost = charge(pricing, 1.0, work[cheapest])
    fastest = shapes[int(np.argmin(through))][1]
    return Floor(min(latency), min(through), work[cheapest], cost, rate, batch, gpus, fastest)
