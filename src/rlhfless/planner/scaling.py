"""Cost-aware actor scaling: time and cost of every candidate N, and the choice between them.

T_total(N) = max_i T_i and C(N) = rho * sum_i G_i * (T_i + cold start), where T_i includes the
actor's start delay from placement. Both are normalised over the candidates and
N' = argmin lam * T~ + (1 - lam) * C~, ties to the smaller N.

Normalisation (`scheduler.normalise`): `range` is the paper's (x - min) / (max - min) (a constant
term normalises to 0). It stretches any spread to [0, 1]: on the simulated 20 x 8 H100 cluster the
decode cost of N = 7..20 actors differs by 2% while N = 1 takes hours, so the 2% counts as much as
the whole time range and lam = 0.7 picked N = 7, 40% slower for 2% less. `relative` (the default)
uses x / min - 1, so lam weighs relative excess time against relative excess cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlhfless.planner.placement import ClusterSpec, rank_within, start_delays
from rlhfless.planner.profile import Profile
from rlhfless.planner.timemodel import RangeModel


@dataclass
class ActorEstimates:
    """Per actor of every candidate N (ranges of one N consecutive, in assignment order)."""

    n_of: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    time: np.ndarray
    cost: np.ndarray
    slot: np.ndarray
    delay: np.ndarray
    hidden: np.ndarray
    work: np.ndarray
    prefill_tokens: np.ndarray


def estimate_actors(
    model: RangeModel,
    starts: np.ndarray,
    ends: np.ndarray,
    n_of: np.ndarray,
    prefill_s: float,
    cluster: ClusterSpec,
    profile: Profile,
    price_per_gpu_hour: float,
) -> ActorEstimates:
    """Time, cost and placement of each range, placement ranked by workload within its N."""
    parts = model.times(starts, ends)
    busy = parts["prefill"] + parts["decode"]
    slot = rank_within(n_of, busy)
    delay = start_delays(slot, parts["kv_tokens"], prefill_s, cluster, profile.gpus)
    time = delay + busy
    anchor = _group_value_at_slot0(n_of, slot, time)
    cost = price_per_gpu_hour / 3600.0 * profile.gpus * (time + profile.cold_start_s)
    hidden = time <= anchor + 1e-9
    return ActorEstimates(
        n_of, starts, ends, time, cost, slot, delay, hidden, parts["work"], parts["prefill_tokens"]
    )


def _group_value_at_slot0(n_of: np.ndarray, slot: np.ndarray, value: np.ndarray) -> np.ndarray:
    """For each item, the value of the item in its group that holds slot 0."""
    groups, inverse = np.unique(n_of, return_inverse=True)
    at0 = np.empty(groups.size)
    at0[inverse[slot == 0]] = value[slot == 0]
    return at0[inverse]


@dataclass
class CandidateTable:
    n: np.ndarray
    time: np.ndarray
    cost: np.ndarray
    score: np.ndarray
    hidden: np.ndarray

    def rows(self) -> list[dict[str, float | int | bool]]:
        return [
            {"n": int(n), "time": float(t), "cost": float(c), "score": float(s), "hidden": bool(h)}
            for n, t, c, s, h in zip(self.n, self.time, self.cost, self.score, self.hidden, strict=True)
        ]


def _normalise(x: np.ndarray, how: str) -> np.ndarray:
    if how == "relative":
        return x / x.min() - 1.0 if x.min() > 0 else np.zeros_like(x)
    span = x.max() - x.min()
    return np.zeros_like(x) if span <= 0 else (x - x.min()) / span


def candidate_table(actors: ActorEstimates, lam: float, normalise: str) -> CandidateTable:
    first = np.flatnonzero(np.r_[True, actors.n_of[1:] != actors.n_of[:-1]])
    time = np.maximum.reduceat(actors.time, first)
    cost = np.add.reduceat(actors.cost, first)
    hidden = np.logical_and.reduceat(actors.hidden, first)
    score = lam * _normalise(time, normalise) + (1.0 - lam) * _normalise(cost, normalise)
    return CandidateTable(actors.n_of[first], time, cost, score, hidden)


def choose(table: CandidateTable) -> int:
    """Index of N' (first minimum: the smallest N among equal scores)."""
    return int(np.argmin(table.score))
