"""Cost-aware actor scaling: time and cost of every candidate N, and the choice between them.

T_total(N) = E[max_i T_i], where T_i includes the actor's start delay from placement (and its cold
start when functions start on demand), and each actor draws its own longest group where the run
has measured how far groups outrun their predictions (`tail.expected_end`). C(N) is the
generation phase's bill under the one pricing model (`planner.pricing.charge`): each decode
function from its request to its release (its cold start as the platform bills it), then its
keep-alive idle to the end of generation when it is kept warm; the resident learner's units for
the whole phase (the actor on them is billed through it); a serverful policy's whole allocation
for the whole phase. The paper's C = rho * sum G_i T_i is
the case of no learner, no keep-alive and no cold start.

The choice: with `scheduler.budget_per_step` the fastest N whose forecast step cost fits it, with
`scheduler.deadline_per_step` the cheapest N whose forecast step time fits it (where the executor
offers several learning widths, `Billing.widths`, the fastest or cheapest pair of N and width:
a narrower learning phase is slower and cheaper); otherwise both are
normalised over the candidates and N' = argmin lam * T~ + (1 - lam) * C~, ties to the smaller N,
T and C with the learning phase's wait for its ranks at that N added (`Billing.learner_wait_s`:
decode functions holding every slot to generation's end leave its ranks to start after it).

Normalisation (`scheduler.normalise`): `range` is the paper's (x - min) / (max - min) (a constant
term normalises to 0). It stretches any spread to [0, 1]: on the simulated 20 x 8 H100 cluster the
decode cost of N = 7..20 actors differs by 2% while N = 1 takes hours, so the 2% counts as much as
the whole time range and lam = 0.7 picked N = 7, 40% slower for 2% less. `relative` (the default)
uses x / min - 1, so lam weighs relative excess time against relative excess cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rlhfless.planner.billing import Billing, LearningWidth, handback
from rlhfless.planner.placement import ClusterSpec, rank_within, start_delays
from rlhfless.planner.pricing import charge, keep_warm
from rlhfless.planner.profile import Profile
from rlhfless.planner.tail import SPREAD, expected_end
from rlhfless.planner.timemodel import RangeModel


class PlanError(ValueError):
    """The step cannot be planned as asked (an infeasible budget or deadline), said in one line.
    `least`: the cheapest (budget) or fastest (deadline) plan's forecast, the least target a plan fits."""

    def __init__(self, message: str, least: float | None = None):
        super().__init__(message)
        self.least = least


# Generation forecasts within this share of each other are a tie: a step's shortfall against verl
# scatters by NOISE / sqrt(prompts), 0.9% at 512 prompts (`forecast.Shortfall`). Where no N is
# within verl's time, lam chooses among the fastest and its ties: a latency-bound step at the
# response cap was forecast at 36.46 s on 14 actors and 36.51 s on 9, at 1.5x the cost
# (`benchmarks/bench_sweep.py` seed 2, H100 Llama-2-70B at TP 2, 64 GPQA prompts of 16 samples).
TIE = 0.005


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
    cold: np.ndarray
    units: np.ndarray  # billed units of its own (0: on the resident learner's)
    # How its longest group may outrun its prediction (`tail.SPREAD`; empty without a tail).
    outrun: np.ndarray = field(default_factory=lambda: np.zeros(0))
    longest: np.ndarray = field(default_factory=lambda: np.zeros(0))
    step1: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tail_top: np.ndarray = field(default_factory=lambda: np.zeros(0))
    most: np.ndarray = field(default_factory=lambda: np.zeros(0))
    log_below: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))

    @classmethod
    def concat(cls, parts: list[ActorEstimates]) -> ActorEstimates:
        """`parts`' actors one after the other."""
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in cls.__dataclass_fields__))

    def take(self, rows: np.ndarray) -> ActorEstimates:
        """These actors' `rows`, in that order (a tail's fields stay empty where there is none)."""
        return ActorEstimates(*(x[rows] if len(x) else x for x in self._columns()))

    def put(self, rows: np.ndarray, other: ActorEstimates) -> ActorEstimates:
        """A copy with `rows` taken from `other`'s actors, in order."""
        columns = [x.copy() for x in self._columns()]
        for x, y in zip(columns, other._columns(), strict=True):
            if len(x):
                x[rows] = y
        return ActorEstimates(*columns)

    def _columns(self) -> list[np.ndarray]:
        return [getattr(self, f) for f in self.__dataclass_fields__]

    def expected_ends(self, first: np.ndarray) -> np.ndarray:
        """Per candidate N (its rows from each of `first` on): when its generation is expected to
        end, the latest of its actors (`tail.expected_end`)."""
        spread = {k: getattr(self, k) for k in SPREAD} if self.log_below.size else None
        return expected_end(self.time, first, spread)


def estimate_actors(
    model: RangeModel,
    starts: np.ndarray,
    ends: np.ndarray,
    n_of: np.ndarray,
    prefill_s: float,
    cluster: ClusterSpec,
    profile: Profile,
    billing: Billing,
) -> ActorEstimates:
    """Time and placement of each range, placement ranked by workload within its N; `cost` is
    the function's own bill until its release (keep-alive and the learner come per N)."""
    parts = model.times(starts, ends)
    busy = parts["prefill"] + parts["decode"]
    slot = rank_within(n_of, busy)
    delay = start_delays(slot, parts["kv_tokens"], prefill_s, cluster, profile.gpus, billing.handoff)
    on_learner = (slot == 0) & (billing.resident_units > 0)
    # Slot 0 is the learner's GPUs, its function started ahead (what is left of that start, if
    # any); the next `warm_actors` reuse warm functions. A function handed its GPUs starts warm.
    cold = np.where(slot <= billing.warm_actors, 0.0, profile.cold_start_s)
    cold = np.where(slot == 0, billing.host_start_s, cold)
    cold = np.zeros_like(cold) if billing.handoff else cold
    time = delay + busy + billing.overhead_s + cold
    units = np.where(on_learner, 0.0, float(profile.gpus))
    cost = charge(billing.pricing, units, time, cold_s=cold)
    anchor = _group_value_at_slot0(n_of, slot, time)
    hidden = time <= anchor + 1e-9
    return ActorEstimates(
        n_of,
        starts,
        ends,
        time,
        cost,
        slot,
        delay,
        hidden,
        parts["work"],
        parts["prefill_tokens"],
        cold,
        units,
        **{k: parts[k] for k in SPREAD if k in parts},
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
    warm: np.ndarray  # per actor (ActorEstimates order): kept warm after release, idle billed in `cost`
    warm_after: np.ndarray  # per N: the kept-warm functions' idle bill over the rest of the step
    wait: np.ndarray | None = None  # per N: the learning phase's wait for its ranks (None: none)

    @property
    def waited(self) -> np.ndarray:
        """Per N, generation and the learning phase's wait for its ranks: when learning can start."""
        return self.time if self.wait is None else self.time + self.wait

    def rows(self) -> list[dict[str, float | int | bool]]:
        columns = (
            np.asarray(self.n).astype(int).tolist(),
            *(np.asarray(x).astype(float).tolist() for x in (self.time, self.cost, self.score)),
            np.asarray(self.hidden).astype(bool).tolist(),
            (np.zeros(len(self.n)) if self.wait is None else np.asarray(self.wait, dtype=float)).tolist(),
        )
        return [
            {"n": n, "time": t, "cost": c, "score": s, "hidden": h, "wait": w}
            for n, t, c, s, h, w in zip(*columns, strict=True)
        ]


def normalised(x: np.ndarray, how: str) -> np.ndarray:
    """`x` over its candidates, as the lam score weighs it (`SchedulerConfig.normalise`)."""
    if how == "relative":
        return x / x.min() - 1.0 if x.min() > 0 else np.zeros_like(x)
    span = x.max() - x.min()
    return np.zeros_like(x) if span <= 0 else (x - x.min()) / span


def candidate_table(
    actors: ActorEstimates,
    billing: Billing,
    serverful: bool,
    lam: float,
    normalise: str,
    profile: Profile,
    after_s: float = 0.0,
) -> CandidateTable:
    """Per candidate N: generation time and cost (see the module docstring), and the lam score;
    `after_s` is the forecast rest of the step (a released function's wait for its next use)."""
    first = np.flatnonzero(np.r_[True, actors.n_of[1:] != actors.n_of[:-1]])
    counts = np.diff(np.r_[first, actors.n_of.size])
    time = actors.expected_ends(first)
    hidden = np.logical_and.reduceat(actors.hidden, first)
    pricing = billing.pricing
    if serverful:  # every function held from its request to the end of the phase
        end = np.repeat(time, counts)
        own = charge(pricing, actors.units, end, cold_s=actors.cold)
        cost = np.add.reduceat(own, first) + charge(pricing, billing.resident_units, time)
        warm = np.ones(actors.n_of.size, dtype=bool)
        # held, not idle: the whole allocation for the rest of the step (less what `after_units` holds)
        units = np.add.reduceat(actors.units, first) + billing.resident_units
        warm_after = charge(pricing, np.maximum(units - billing.after_units, 0.0), after_s)
    elif billing.handoff:  # each GPU back to the learner at the end: idle till then, or restarted
        idle = np.repeat(time, counts) - actors.time
        warm = keep_warm(pricing, idle, profile.cold_start_s, 0.0)
        back = handback(pricing, actors.units, idle, warm, profile.cold_start_s)
        untaken = np.maximum(billing.after_units - np.add.reduceat(actors.units, first), 0.0)
        spare = handback(
            pricing, untaken, time, keep_warm(pricing, time, profile.cold_start_s, 0.0), profile.cold_start_s
        )
        cost = np.add.reduceat(actors.cost + back, first) + spare
        warm_after = np.zeros(time.size)
    else:
        end = np.repeat(time, counts)
        idle = end - actors.time
        gap = idle + (after_s if billing.next_use_after else np.inf)
        warm = keep_warm(pricing, gap, profile.cold_start_s, lam) | (actors.units == 0)  # free to keep
        idle_cost = charge(pricing, actors.units, 0.0, idle_s=np.where(warm, idle, 0.0))
        cost = np.add.reduceat(actors.cost + idle_cost, first) + charge(pricing, billing.resident_units, time)
        warm_after = np.add.reduceat(
            charge(pricing, actors.units, 0.0, idle_s=np.where(warm, after_s, 0.0)), first
        )
    # The score weighs what N changes: generation, and the learning phase's wait for its ranks.
    wait = billing.rank_wait(actors.n_of[first])
    wait_cost = charge(pricing, billing.after_units, wait)
    score = lam * normalised(time + wait, normalise) + (1.0 - lam) * normalised(cost + wait_cost, normalise)
    return CandidateTable(actors.n_of[first], time, cost, score, hidden, warm, warm_after, wait)


# Each target's unit, and the plan nearest to it when none fits.
TARGETS = {"budget_per_step": ("$", "cheapest"), "deadline_per_step": ("s", "fastest")}


def target_of(
    budget: float | None, deadline: float | None, step_time: float, step_cost: float
) -> dict[str, float]:
    """A plan's target record: {"budget_per_step": $} or {"deadline_per_step": s}, with "missed"
    1.0 where the plan's whole-step forecast is past it (the nearest plan), else 0.0; {} for none."""
    for key, value, forecast in (
        ("budget_per_step", budget, step_cost),
        ("deadline_per_step", deadline, step_time),
    ):
        if value is not None:
            return {key: value, "missed": float(forecast > value * (1 + 1e-9))}
    return {}


def target_message(key: str, target: float, least: float, n: int) -> str:
    """One line: the budget or deadline `key` asked `target`, and the nearest plan (N=`n`) `least`."""
    unit, best = TARGETS[key]
    return (
        f"scheduler.{key}: got {target:.6g} {unit}, expected at least the {best} plan's forecast "
        f"{least:.6g} {unit} (N={n})"
    )


def _within(
    bound: np.ndarray,
    other: np.ndarray,
    target: float,
    margin: float,
    n: np.ndarray,
    key: str,
    nearest: bool,
) -> int:
    """The candidate best in `other` whose `bound` forecast, raised by `margin`, fits `target`;
    short of one, the one best in `bound` if its bare forecast fits, or if `nearest`; else PlanError."""
    fits = np.flatnonzero(bound * (1.0 + margin) <= target * (1 + 1e-9))
    if fits.size:
        return int(fits[np.lexsort((bound[fits], other[fits]))[0]])
    i = int(np.argmin(bound))
    if nearest or bound[i] <= target * (1 + 1e-9):  # the plan leaving most room, or nearest to it
        return i
    raise PlanError(target_message(key, target, float(bound[i]), int(n[i])), least=float(bound[i]))


def choose(
    table: CandidateTable,
    after: tuple[float, float] = (0.0, 0.0),
    budget: float | None = None,
    deadline: float | None = None,
    margins: tuple[float, float] = (0.0, 0.0),
    time_cap: float | None = None,
    nearest: bool = False,
) -> int:
    """Index of N': the fastest within `budget` ($ per step), the cheapest within `deadline`
    (s per step), else the first minimum of the lam score (the smallest N among equal scores)
    among the candidates whose generation and learning's wait for its ranks (`waited`) are within
    `time_cap` seconds, verl's generation (its ranks resident, they wait none); where none is,
    among those within `TIE` of the earliest start of learning.
    `after` is the rest of the step's (seconds, USD); a plan fits when its forecast, raised by
    the (time, cost) `margins` the forecast has lately fallen short by, does. When no candidate
    fits: the cheapest or fastest plan there is if `nearest`, else PlanError naming it."""
    step_time, step_cost = table.time + after[0], table.cost + table.warm_after + after[1]
    if budget is not None:
        return _within(step_cost, step_time, budget, margins[1], table.n, "budget_per_step", nearest)
    if deadline is not None:
        return _within(step_time, step_cost, deadline, margins[0], table.n, "deadline_per_step", nearest)
    if time_cap is not None:
        waited = table.waited
        fits = waited <= time_cap
        if not fits.any():  # the fastest, and those no forecast can tell from it
            fits = waited <= waited.min() * (1.0 + TIE)
        return int(np.argmin(np.where(fits, table.score, np.inf)))
    return int(np.argmin(table.score))


def _over_widths(
    table: CandidateTable, billing: Billing, tokens: float
) -> tuple[CandidateTable, tuple[np.ndarray, np.ndarray]]:
    """`table` repeated once per one of `billing.widths`, and the rest of the step (seconds, USD)
    at `tokens` predicted tokens for each row, forecast at its width."""
    widths = billing.widths
    rests = [billing.at_width(w).after_generation(tokens, table.n) for w in widths]
    tiled = CandidateTable(
        *(np.tile(x, len(widths)) for x in (table.n, table.time, table.cost, table.score, table.hidden)),
        table.warm,
        np.tile(table.warm_after, len(widths)),
        None if table.wait is None else np.tile(table.wait, len(widths)),
    )
    return tiled, (np.concatenate([r[0] for r in rests]), np.concatenate([r[1] for r in rests]))


def choose_width(
    table: CandidateTable,
    billing: Billing,
    tokens: float,
    budget: float | None,
    deadline: float | None,
    margins: tuple[float, float],
    nearest: bool = False,
) -> tuple[int, LearningWidth]:
    """(index of N', learning width) under a budget or deadline (`choose`), over every pair of a
    candidate N and one of `billing.widths`, the rest of the step at `tokens` predicted tokens
    forecast at that width."""
    tiled, after = _over_widths(table, billing, tokens)
    i = choose(tiled, after, budget, deadline, margins, nearest=nearest)
    return i % table.n.size, billing.widths[i // table.n.size]


def width_options(table: CandidateTable, billing: Billing, tokens: float) -> list[dict[str, float]]:
    """Every pair of a candidate N and one of `billing.widths`, with its forecast step time and
    cost: the plans a budget or deadline chooses among (none where it offers no widths)."""
    if not billing.widths:
        return []
    tiled, after = _over_widths(table, billing, tokens)
    widths = np.repeat([w.width for w in billing.widths], table.n.size)
    columns = (tiled.n, widths, tiled.time + after[0], tiled.cost + tiled.warm_after + after[1])
    return [
        {"n": int(n), "width": int(w), "step_time": float(t), "step_cost": float(c)}
        for n, w, t, c in zip(*(np.asarray(x).tolist() for x in columns), strict=True)
    ]
