"""`plan_step`: one training step's whole scheduling decision, for the runtime and the simulator.

predict lengths -> deduplicate prefixes -> for every candidate N assign prompts, estimate each
actor's time, place it and charge its start delay -> choose N' -> the chosen N's actors.
The policy (`rlhfless`, `verl`, `rlhfuse`) and the rlhfless feature toggles decide which parts run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from rlhfless.planner.assignment import lpt_ranges
from rlhfless.planner.balance import alternatives, between, coarse, contiguous_ranges, refine, widen
from rlhfless.planner.billing import Billing, LearningWidth
from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.dedup import Dedup, PackedPrompts, deduplicate, tree_tokens
from rlhfless.planner.floor import generation_floor
from rlhfless.planner.placement import ClusterSpec
from rlhfless.planner.predictor import LengthPredictor
from rlhfless.planner.pricing import keep_warm
from rlhfless.planner.profile import Profile
from rlhfless.planner.scaling import (
    ActorEstimates,
    CandidateTable,
    candidate_table,
    choose,
    choose_width,
    estimate_actors,
    target_of,
    width_options,
)
from rlhfless.planner.step_plan import ActorPlan, PromptSpec, StepPlan
from rlhfless.planner.tail import Tail
from rlhfless.planner.timemodel import RangeModel, Workload
from rlhfless.planner.verl_time import verl_cap, verl_workload


def candidate_bounds(
    config: SchedulerConfig, cluster: ClusterSpec, prompts: int, scaling: bool
) -> np.ndarray:
    """Candidate N values: [n_min, n_max] clipped to the cluster and the prompt count."""
    hi = min(cluster.max_actors(config.gpus_per_actor), prompts)
    if config.n_max is not None:
        hi = min(hi, config.n_max)
    if not scaling:
        return np.array([hi], dtype=np.int64)
    lo = min(config.n_min, hi)
    return np.arange(lo, hi + 1, dtype=np.int64)


def _check_inputs(
    profile: Profile, cluster: ClusterSpec, config: SchedulerConfig, prompts: int, g: int
) -> None:
    if prompts == 0:
        raise ValueError("prompts: got none, expected at least one prompt to plan")
    if g < 1:
        raise ValueError(f"group_size: got {g}, expected an integer >= 1")
    if config.gpus_per_actor > cluster.gpus_per_node:
        raise ValueError(
            f"gpus_per_actor: got {config.gpus_per_actor}, expected at most gpus_per_node "
            f"({cluster.gpus_per_node}): an actor lives on one node"
        )
    if profile.gpus != config.gpus_per_actor:
        raise ValueError(
            f"gpus_per_actor: got {config.gpus_per_actor}, expected the profile's actor size ({profile.gpus})"
        )


def _lpt_estimates(
    workload: Workload, ns: np.ndarray, profile: Profile, config: SchedulerConfig, **kw: Any
) -> tuple[list[np.ndarray], ActorEstimates]:
    """LPT breaks contiguity: per N, reorder prompts actor by actor and time those ranges."""
    orders, parts = [], []
    for n in ns:
        order, starts, ends = lpt_ranges(workload.work, workload.group_max, int(n))
        model = RangeModel(workload, order, profile, config.segments)
        n_of = np.full(int(n), n)
        parts.append(estimate_actors(model, starts, ends, n_of, profile=profile, **kw))
        orders.append(order)
    return orders, ActorEstimates.concat(parts)


def _weighed(
    actors: ActorEstimates,
    n: int,
    others: list[tuple[ActorEstimates, np.ndarray | None]],
    lam: float,
    scored: tuple,
) -> tuple[ActorEstimates, np.ndarray | None]:
    """`actors` with N = n's rows taken from the one of `others` (`balance.alternatives`) that
    lam scores best at that N against its own (its time and cost relative to theirs, weighed
    lam and 1 - lam), with that one's prompt order; else `actors` and None. An assignment that
    ends sooner may cost more: every actor then runs until nearly the end."""
    rows = np.flatnonzero(actors.n_of == n)
    own = candidate_table(actors.take(rows), *scored)
    best, pick = 0.0, (actors, None)
    for other, order in others:
        table = candidate_table(other, *scored)
        score = lam * (table.time[0] / own.time[0] - 1) + (1 - lam) * (table.cost[0] / own.cost[0] - 1)
        if score < best:
            best, pick = score, (actors.put(rows, other), order)
    return pick


def plan_step(
    prompts: Sequence[PromptSpec],
    predictor: LengthPredictor,
    profile: Profile,
    cluster: ClusterSpec,
    config: SchedulerConfig,
    group_size: int,
    billing: Billing | None = None,
    max_length: float | None = None,
    floor_shapes: Sequence[Profile] = (),
    cap: float | None = None,
) -> StepPlan:
    """Plan one step. `billing` says how the executor starts and bills functions (default: on
    demand, no resident learner, `config.pricing`); `max_length` caps predicted response lengths
    (the engine's max_new_tokens); `floor_shapes`: every actor shape the floor may take the best
    of (default: `profile` alone); `cap`: the generation time lam's N must be within
    (`verl_time.verl_cap`), where the caller timed verl at its own actor size (default: timed
    here, at `profile`, when lam would take a slower plan than the fastest)."""
    t0 = time.perf_counter()
    n_prompts = len(prompts)
    _check_inputs(profile, cluster, config, n_prompts, group_size)
    billing = billing or Billing(config.pricing)
    feats = config.features
    uids = [p.uid for p in prompts]
    answers = [p.answer_tokens for p in prompts]
    sources = [p.source for p in prompts]
    gmax, gmean = predictor.predict(uids, answers, sources)
    if max_length is not None:
        gmax, gmean = np.minimum(gmax, max_length), np.minimum(gmean, max_length)

    rule = str(feats["prefix_rule"]) if feats["dedup_prefill"] else None
    lengths, dedup, decode_prefill, kv_tokens, prefill = _prefill_work(
        prompts, rule, config.prefill_capacity, group_size
    )
    prefill_s = float(profile.prefill_seconds(prefill["tokens"]))
    tail = Tail.of(predictor.tail_ratios(uids), max_length)
    workload = Workload(gmax, gmean, lengths, decode_prefill, kv_tokens, group_size, tail)

    ns = candidate_bounds(config, cluster, n_prompts, bool(feats["actor_scaling"]))
    kw = {"prefill_s": prefill_s, "cluster": cluster, "billing": billing}
    ranges, grid = None, ns
    if feats["sorted_assignment"] and config.assignment_method == "lpt":
        orders, actors = _lpt_estimates(workload, ns, profile, config, **kw)
    else:
        grid = coarse(ns)
        rounds = int(feats["balance_rounds"])
        sort, backfill = bool(feats["sorted_assignment"]), bool(feats["backfill"])
        ranges = contiguous_ranges(workload, grid, profile, config.segments, rounds, sort, backfill)
        estimate = partial(estimate_actors, profile=profile, **kw)
        actors = estimate(ranges.model, ranges.starts, ranges.ends, ranges.n_of)
    g_rest = np.full(n_prompts, group_size - 1.0)
    floor = generation_floor(
        [(p, cluster.max_actors(p.gpus)) for p in floor_shapes or [profile]],
        np.r_[lengths, lengths],
        np.r_[gmax, workload.rest_length],
        prefill["tokens_unique"],
        billing.pricing,
        counts=np.r_[np.ones(n_prompts), g_rest],
    )
    serverful = config.policy == "verl"
    tokens = float(workload.work.sum() + group_size * lengths.sum())
    after = billing.after_generation(tokens)  # the learner's wait for its ranks apart (per N below)
    scored = (billing, serverful, config.lam, config.normalise, profile, after[0])
    table = candidate_table(actors, *scored)
    margins = (billing.time_margin, billing.cost_margin)
    capped = ranges is not None and config.max_slowdown is not None and config.policy == "rlhfless"
    caps: list[float] = []  # verl's time, timed once and only when lam would take a slower plan
    targets = (config.budget_per_step, config.deadline_per_step)

    nearest = config.target_miss == "nearest"
    targeted = config.budget_per_step is not None or config.deadline_per_step is not None

    def pick_n(table: CandidateTable) -> tuple[int, LearningWidth | None]:
        if targeted and billing.widths:
            return choose_width(table, billing, tokens, *targets, margins, nearest)
        rest = billing.after_generation(tokens, table.n)
        pick = choose(table, rest, *targets, margins, nearest=nearest)
        if not capped or targeted or table.waited[pick] <= table.waited.min():
            return pick, None
        if not caps:
            caps.append(
                verl_cap(
                    verl_workload(workload),
                    int(ns.max()),
                    profile,
                    config.segments,
                    config.max_slowdown,
                    billing,
                    ranges.model.prompt_segments if ranges is not None else None,
                )
                if cap is None
                else cap
            )
        return choose(table, rest, time_cap=caps[0]), None

    pick, width = pick_n(table)
    if ranges is not None:
        extra = between(ns, grid, int(table.n[pick]))
        if extra.size:
            ranges, actors = widen(ranges, actors, extra, rounds, estimate)
        more = config.refine_rounds if rounds else 0  # balanced plans only (not verl's even split)
        mixed = None
        if extra.size or more:
            n = int(table.n[pick])
            actors = refine(ranges, actors, n, more, estimate)
            if more:
                actors, mixed = _weighed(
                    actors, n, alternatives(ranges, actors, n, estimate), config.lam, scored
                )
            table = candidate_table(actors, *scored)
            pick, width = pick_n(table)
        orders = [ranges.order] * table.n.size
        if mixed is not None:
            orders[int(np.flatnonzero(table.n == n)[0])] = mixed
    admission = gmax if feats["longest_first"] else None
    names = np.array(uids, dtype=object)  # gathered per actor and per prefix group alike
    chosen = _chosen_actors(actors, table, pick, orders[pick], names, cluster, profile, admission)
    rest = (billing.at_width(width) if width else billing).after_generation(tokens, table.n[pick])
    step_time = float(table.time[pick] + rest[0])
    unused_warm = serverful or bool(keep_warm(billing.pricing, step_time, profile.cold_start_s, config.lam))
    step_cost = float(table.cost[pick] + table.warm_after[pick] + rest[1])
    target = target_of(config.budget_per_step, config.deadline_per_step, step_time, step_cost)

    prefix_groups, prefix_tree = dedup.layout(names) if dedup else ([], [])
    return StepPlan(
        policy=config.policy,
        n_actors=int(table.n[pick]),
        prefix_length=dedup.prefix_length if dedup else 0,
        unique_prefixes=len(prefix_groups),
        prefix_groups=prefix_groups,
        actors=chosen,
        candidates=table.rows(),
        predicted_time=float(table.time[pick]),
        predicted_cost=float(table.cost[pick]),
        prefill={"seconds": prefill_s, **prefill},
        cut=str(feats["cut"]),
        tau=config.tau,
        predicted_length=dict(zip(uids, gmax.tolist(), strict=True)),
        plan_seconds=time.perf_counter() - t0,
        features=dict(feats),
        predicted_step_time=step_time,
        predicted_step_cost=step_cost,
        target=target,
        keep_unused_warm=unused_warm,
        floor=floor.to_dict(),
        prefix_tree=prefix_tree,
        profile=profile,
        time_cap=caps[0] if caps else None,
        verl_actors=int(ns.max()) if caps else 0,
        predicted_mean=gmean if caps else None,
        learner_width=width.width if width else 0,
        rank_start_s=billing.rank_start_s,
        step_options=width_options(table, billing, tokens),
        overrun=list(predictor.overrun),
        tail=tail,
    )


def _prefill_work(
    prompts: Sequence[PromptSpec], rule: str | None, capacity: int, g: int
) -> tuple[np.ndarray, Dedup | None, np.ndarray, np.ndarray, dict[str, Any]]:
    """Who computes which prompt tokens under `rule` (None: no dedup): prompt lengths; per prompt,
    the tokens its decode actor prefills and the prefix tokens it receives as KV; the prefill
    actor's tokens; and the step's token counts (`tokens_computed` = prefill actor + every decode
    actor's own prefill; `tokens_unique` = the prefix tree's, the least any prefill computes;
    `tree_ratio` = computed / unique, 1.0 at best)."""
    packed = PackedPrompts.pack([p.prompt_tokens for p in prompts])
    lengths = packed.lengths
    total = int(lengths.sum())
    counts: dict[str, Any] = {"rule": rule or "none", "tokens_naive": total * g, "tokens_per_prompt": total}
    if rule is None:  # every sample prefills its whole prompt
        unique = tree_tokens(packed)
        work = (lengths, None, lengths * g, np.zeros_like(lengths))
        computed, prefill_tokens = total * g, 0
    else:
        dedup = deduplicate(packed, capacity, rule)
        unique = dedup.unique_tokens
        work = (lengths, dedup, dedup.remaining_tokens, dedup.prefix_tokens)
        computed, prefill_tokens = dedup.tokens(g)["dedup"], dedup.levels.tokens
    ratio = computed / unique if unique else 1.0
    return (
        *work,
        {
            "tokens": prefill_tokens,
            **counts,
            "tokens_unique": unique,
            "tokens_computed": computed,
            "tree_ratio": ratio,
        },
    )


def _chosen_actors(
    actors: ActorEstimates,
    table: CandidateTable,
    pick: int,
    order: np.ndarray,
    uids: np.ndarray,
    cluster: ClusterSpec,
    profile: Profile,
    admission: np.ndarray | None,
) -> list[ActorPlan]:
    """The chosen N's actors (`uids`: an object array, input order); each actor's uids in
    admission order: longest `admission` (predicted group max) first when given, else assignment
    order."""
    rows = np.flatnonzero(actors.n_of == table.n[pick])
    sizes = actors.ends[rows] - actors.starts[rows]
    held = np.concatenate([order[s:e] for s, e in zip(actors.starts[rows], actors.ends[rows], strict=True)])
    if admission is not None:  # within each actor (stable: ties keep assignment order)
        longest_first = np.argsort(-admission[held], kind="stable")
        # ... then back into actors: a stable sort of small integers is a radix sort
        actor = np.repeat(np.arange(rows.size), sizes).astype(np.min_scalar_type(rows.size))
        held = held[longest_first[np.argsort(actor[longest_first], kind="stable")]]
    names = uids[held].tolist()
    cuts = np.r_[0, np.cumsum(sizes)].tolist()
    floats = ("time", "cost", "delay", "work", "prefill_tokens", "cold")
    nodes, first_gpus = cluster.slot_gpus(actors.slot[rows], profile.gpus)
    columns = zip(
        nodes.tolist(),
        first_gpus.tolist(),
        *(getattr(actors, f)[rows].astype(float).tolist() for f in floats),
        actors.hidden[rows].astype(bool).tolist(),
        table.warm[rows].astype(bool).tolist(),
        strict=True,
    )
    out = []
    for i, (node, first, time_s, cost, delay, work, prefill, cold, hidden, warm) in enumerate(columns):
        out.append(
            ActorPlan(
                actor=i,
                uids=names[cuts[i] : cuts[i + 1]],
                gpus=profile.gpus,
                gpu_ids=list(range(first, first + profile.gpus)),
                node=node,
                predicted_time=time_s,
                predicted_cost=cost,
                start_delay=delay,
                hidden=hidden,
                predicted_tokens=work,
                prefill_tokens=prefill,
                cold_start=cold,
                keep_warm=warm,
            )
        )
    return out
