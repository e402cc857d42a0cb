"""`plan_shapes`: one step planned over several decode actor sizes (tensor-parallel sizes), for
the simulator and `rlhfless plan` on a GPU cluster: each size's plan as `plan.plan_step` makes it,
a split between two (`planner.pools`), and the one the rule choosing N within a size would take.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from rlhfless.planner.billing import Billing
from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.placement import ClusterSpec
from rlhfless.planner.plan import candidate_bounds, plan_step
from rlhfless.planner.pools import latency_bound, split_plans
from rlhfless.planner.predictor import LengthPredictor
from rlhfless.planner.profile import Profile
from rlhfless.planner.scaling import CandidateTable, PlanError, choose, normalised
from rlhfless.planner.step_plan import PromptSpec, StepPlan
from rlhfless.planner.tail import Tail
from rlhfless.planner.timemodel import Workload
from rlhfless.planner.verl_time import verl_cap, verl_workload

TARGET_LAMS = (0.0, 0.25, 0.5, 0.75, 1.0)  # the lams a split's parts are planned at under a target


def plan_shapes(
    prompts: Sequence[PromptSpec],
    predictor: LengthPredictor,
    profiles: Sequence[Profile],
    cluster: ClusterSpec,
    config: SchedulerConfig,
    group_size: int,
    billing: Billing | None = None,
    max_length: float | None = None,
    baseline: Profile | None = None,
) -> StepPlan:
    """Plan one step with decode actors of any one of several shapes (`profiles`, one per
    tensor-parallel size): each shape's plan as `plan_step` makes it and, with
    `scheduler.split_sizes`, the best split between two (`planner.pools`); then the one `_across`
    takes on their whole-step forecasts. The plan keeps each option's in `shape_options`.

    `baseline` is the size verl runs at (`model.tp`): lam's N, in every size and split, stays
    within verl's generation time there (`scheduler.max_slowdown`), and so does the size taken.
    Timed at each size's own instead, verl's even split over a smaller size's actors could be the
    slower one, and a plan slower than verl passed (a random sweep, session 37: 4 x 8 H200,
    Qwen2.5-7B at TP 2, 64 LCB prompts a step, took TP 1 actors at 13.6 s against verl's 10.0).

    A split's parts are planned free of a budget or deadline, which the joined plan is held to.
    Under one, each split is planned at every lam of `TARGET_LAMS`, from the cheapest parts to the
    fastest, so that the target chooses among splits as it chooses N within a size; and a target
    no single shape meets may still be met by a split. Without this, on paper-sim's gsm8k (splits
    forecast at 141-146 s a step), a deadline of 160 s was refused: the fastest single size was
    forecast at 166 s."""
    t0 = time.perf_counter()
    targeted = config.budget_per_step is not None or config.deadline_per_step is not None
    predicted = _predicted(prompts, predictor, max_length) if len(profiles) > 1 else None
    verl = None
    if baseline is not None and predicted is not None and not targeted:
        uids = [p.uid for p in prompts]
        tail = Tail.of(predictor.tail_ratios(uids), max_length)  # as `plan_step` times its own plans
        verl = _verl_cap(predicted, baseline, cluster, config, group_size, billing, tail)
    cap = verl[0] if verl else None
    plans, refused = [], []
    for profile in profiles:
        shaped = replace(config, gpus_per_actor=profile.gpus)
        try:
            plans.append(
                plan_step(
                    prompts,
                    predictor,
                    profile,
                    cluster,
                    shaped,
                    group_size,
                    billing,
                    max_length,
                    profiles,
                    cap,
                )
            )
        except PlanError as err:  # this shape cannot meet the target; another may
            if len(profiles) == 1:
                raise
            refused.append(err)
    if len(plans) == len(profiles) == 1:
        return plans[0]
    options, versus = list(plans), None
    if config.features["split_sizes"] and len(profiles) > 1:
        bases = plans or [
            plan_step(
                prompts,
                predictor,
                profile,
                cluster,
                replace(config, gpus_per_actor=profile.gpus, budget_per_step=None, deadline_per_step=None),
                group_size,
                billing,
                max_length,
                profiles,
            )
            for profile in profiles
        ]
        lams = TARGET_LAMS if targeted else (config.lam,)
        splits = _splits(
            prompts,
            predicted,
            predictor,
            profiles,
            bases,
            cluster,
            config,
            group_size,
            billing,
            max_length,
            lams,
            cap,
        )
        if splits:  # the best split beside every single size
            options.append(splits[_across(splits, config, billing, cap=cap)])
            if plans:  # the run learns how the split would have fared against the best single size
                versus = (options[-1], plans[_across(plans, config, billing, cap=cap)])
    if not options:
        raise min(refused, key=lambda e: e.least if e.least is not None else np.inf)
    try:
        chosen = options[_across(options, config, billing, strict=targeted, cap=cap)]
    except PlanError as err:
        raise min([*refused, err], key=lambda e: e.least if e.least is not None else np.inf) from None
    if verl:  # the shortfall compares any plan taken, a split's too, with verl at its size
        chosen = replace(chosen, verl_actors=verl[1])
    if predicted is not None:
        chosen = replace(chosen, predicted_mean=predicted[1], split_versus=versus)
    chosen.plan_seconds = time.perf_counter() - t0
    chosen.shape_options = [_option(p) for p in options]
    return chosen


def _splits(
    prompts: Sequence[PromptSpec],
    predicted: tuple[np.ndarray, np.ndarray, np.ndarray],
    predictor: LengthPredictor,
    profiles: Sequence[Profile],
    plans: Sequence[StepPlan],
    cluster: ClusterSpec,
    config: SchedulerConfig,
    group_size: int,
    billing: Billing | None,
    max_length: float | None,
    lams: Sequence[float],
    cap: float | None = None,
) -> list[StepPlan]:
    """Plans split between a larger size and a smaller one (`planner.pools`), their parts
    planned at each of `lams`: the smaller is the best single size's where that is not the
    largest, else the next below it, and the larger each size above it; none where the smaller
    alone would not wait on the longest predicted sequence (`pools.latency_bound`). Within the
    learner's node only where the smaller is the best single size's: else its bulk decodes
    each token slower than that size would, and a sequence that outruns its prediction there
    sets the step's end, with no actor of the other part to move to. On one H100 node, 64 LCB
    prompts of Llama-2-7B at TP 2 (a random sweep, simulated) such splits of TP 2 and TP 1 were
    forecast 2-3% sooner and generated 3% slower than verl. `predicted`: `_predicted`'s figures."""
    by_size = sorted(profiles, key=lambda p: p.gpus)
    best = plans[_across(plans, config, cap=cap)].profile
    within = best is not None and best.gpus < by_size[-1].gpus
    small = best if within else by_size[-2]
    gmax, gmean, lengths = predicted
    billing = billing or Billing(config.pricing)
    actors = cluster.max_actors(small.gpus)
    if not latency_bound(small, lengths, gmax, gmean, group_size, actors, billing.pricing):
        return []

    def part(
        subset: Sequence[PromptSpec], profile: Profile, nodes: ClusterSpec, cfg: SchedulerConfig
    ) -> StepPlan:
        # A part takes over only its own nodes' GPUs from the learner (`Billing.handoff`).
        own = replace(billing, after_units=float(nodes.total_gpus)) if billing.handoff else billing
        return plan_step(subset, predictor, profile, nodes, cfg, group_size, own, max_length, profiles, cap)

    return [
        split
        for lam in lams
        for large in by_size
        if large.gpus > small.gpus
        for split in split_plans(
            prompts,
            gmax,
            large,
            small,
            cluster,
            replace(config, lam=lam),
            group_size,
            billing,
            plans[0],
            part,
            within,
        )
    ]


def _option(plan: StepPlan) -> dict[str, Any]:
    """One decode actor size's plan, or a split's, as `shape_options` lists it: a split's
    `pools` are [GPUs per actor, actors, prompts] of each part."""
    pools = [[p.profile.gpus if p.profile else 0, p.n_actors, len(p.predicted_length)] for p in plan.pools]
    return {
        "gpus": 0 if pools else (plan.profile.gpus if plan.profile else 0),
        "n": plan.n_actors,
        "time": plan.predicted_time,
        "cost": plan.predicted_cost,
        "step_time": plan.predicted_step_time,
        "step_cost": plan.predicted_step_cost,
        **({"pools": pools} if pools else {}),
    }


def _across(
    plans: Sequence[StepPlan],
    config: SchedulerConfig,
    billing: Billing | None = None,
    strict: bool = False,
    cap: float | None = None,
) -> int:
    """Index of the plan to take, by `choose` over their whole-step forecasts: under a budget the
    fastest that fits it, under a deadline the cheapest that fits, each raised by `billing`'s
    margins; else the least lam score among those whose generation is within `cap` (the fastest
    generation where none is). Where no plan fits a target: the nearest, unless `strict` and
    `scheduler.target_miss` asks for an error (PlanError naming the nearest). A split's
    generation is weighed stretched by `billing.split_shortfall`, how much further short of its
    forecast the run's splits have fallen than a single size's."""
    stretch = billing.split_shortfall if billing is not None else 1.0
    generation = np.array([p.predicted_time * (stretch if p.pools else 1.0) for p in plans])
    t = np.array([p.predicted_step_time - p.predicted_time for p in plans]) + generation
    c = np.array([p.predicted_step_cost for p in plans])
    how, lam = config.normalise, config.lam
    score = lam * normalised(t, how) + (1.0 - lam) * normalised(c, how)
    generation_cost = np.array([p.predicted_cost for p in plans])
    none = np.zeros(len(plans))
    table = CandidateTable(
        np.array([p.n_actors for p in plans]),
        generation,
        generation_cost,
        score,
        none.astype(bool),
        none.astype(bool),
        none,
    )
    margins = (billing.time_margin, billing.cost_margin) if billing is not None else (0.0, 0.0)
    nearest = not strict or config.target_miss == "nearest"
    return choose(
        table,
        (t - generation, c - generation_cost),  # the rest of each plan's step
        budget=config.budget_per_step,
        deadline=config.deadline_per_step,
        margins=margins,
        time_cap=cap,
        nearest=nearest,
    )


def _verl_cap(
    predicted: tuple[np.ndarray, np.ndarray, np.ndarray],
    baseline: Profile,
    cluster: ClusterSpec,
    config: SchedulerConfig,
    group_size: int,
    billing: Billing | None,
    tail: Tail | None = None,
) -> tuple[float, int] | None:
    """verl's generation of the step at its own size, as the cap of lam's N (`verl_time.verl_cap`),
    and verl's actor count (`predicted`: `_predicted`'s figures; `tail`: the run's, as lam's plans
    are timed); None where lam is not capped."""
    if config.max_slowdown is None or config.policy != "rlhfless":
        return None
    gmax, gmean, lengths = predicted
    zeros = np.zeros_like(lengths)
    verl = verl_workload(Workload(gmax, gmean, lengths, zeros, zeros, group_size, tail))
    n = int(candidate_bounds(replace(config, gpus_per_actor=baseline.gpus), cluster, lengths.size, False)[0])
    billing = billing or Billing(config.pricing)
    return verl_cap(verl, n, baseline, config.segments, config.max_slowdown, billing), n


def _predicted(
    prompts: Sequence[PromptSpec], predictor: LengthPredictor, max_length: float | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each prompt's predicted group max and mean (capped at `max_length`, as `plan_step` caps
    them) and its prompt length."""
    gmax, gmean = predictor.predict(
        [p.uid for p in prompts], [p.answer_tokens for p in prompts], [p.source for p in prompts]
    )
    if max_length is not None:
        gmax, gmean = np.minimum(gmax, max_length), np.minimum(gmean, max_length)
    lengths = np.fromiter((len(p.prompt_tokens) for p in prompts), dtype=float, count=len(prompts))
    return gmax, gmean, lengths
