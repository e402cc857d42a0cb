"""A step's decode actors in two sizes: the longest predicted prompts on actors of a larger size,
which decode each token faster, and the rest on actors of a smaller one, which decode the most
tokens per GPU.

An actor of the smaller size that holds the step's longest prompts can set the step's end, since
each of its tokens takes longer; on actors of the larger size those prompts finish sooner, while
the bulk keeps the smaller size's throughput. Each part is planned by `plan_step` on GPUs of its
own (the larger size on the learner's node, first), and the step's plan is the two side by side
(`StepPlan.pools`). Splits tried: the longest `SHARES` of the prompts on `NODES` whole nodes, or
on one or half a node's worth of larger actors within the learner's node (`places`), only where
the smaller size alone would be latency-bound (`latency_bound`); the caller keeps one only where
it beats every single size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from rlhfless.planner.billing import Billing
from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.floor import generation_floor
from rlhfless.planner.placement import ClusterSpec
from rlhfless.planner.pricing import Pricing
from rlhfless.planner.profile import Profile
from rlhfless.planner.scaling import PlanError, target_of
from rlhfless.planner.step_plan import PromptSpec, StepPlan
from rlhfless.planner.timemodel import Workload

SHARES = (0.005, 0.01, 0.02, 0.05)  # of the step's prompts, longest predicted first
NODES = (1, 2)  # nodes of the largest size

# plan_step with its prompts, profile, cluster and config given (the rest fixed by the caller)
PartPlanner = Callable[[Sequence[PromptSpec], Profile, ClusterSpec, SchedulerConfig], StepPlan]


def latency_bound(
    profile: Profile,
    prompt_tokens: np.ndarray,
    group_max: np.ndarray,
    group_mean: np.ndarray,
    group_size: int,
    actors: int,
    pricing: Pricing,
) -> bool:
    """Whether `actors` actors of `profile` alone would wait on the step's longest predicted
    sequence rather than on its tokens (its latency bound at least its throughput bound): only
    then can actors that decode each token faster shorten the step, at fewer tokens per GPU."""
    n, g = len(prompt_tokens), group_size
    rest = Workload(group_max, group_mean, prompt_tokens, prompt_tokens, prompt_tokens * 0, g).rest_length
    floor = generation_floor(
        [(profile, actors)],
        np.r_[prompt_tokens, prompt_tokens],
        np.r_[group_max, rest],
        0.0,
        pricing,
        counts=np.r_[np.ones(n), np.full(n, g - 1.0)],
    )
    return floor.latency_s >= floor.throughput_s


def split_plans(
    prompts: Sequence[PromptSpec],
    group_max: np.ndarray,
    large: Profile,
    small: Profile,
    cluster: ClusterSpec,
    config: SchedulerConfig,
    group_size: int,
    billing: Billing,
    whole: StepPlan,
    plan_part: PartPlanner,
    within: bool = False,
) -> list[StepPlan]:
    """Every split's plan (none on nodes of unequal GPUs), each with the floor and unique prompt
    tokens of `whole`, a plan of the whole step at one size; within the learner's node too where
    `within` (`places`). Each part is planned without the step's budget or deadline, which the
    joined plan is held to."""
    n = len(prompts)
    if cluster.node_gpus or n < 2:
        return []
    free = replace(config, budget_per_step=None, deadline_per_step=None)
    order = np.argsort(-np.asarray(group_max, dtype=float), kind="stable")
    unique = int(whole.prefill["tokens_unique"])
    uids = [p.uid for p in prompts]
    counts = sorted({min(max(1, round(share * n)), n - 1) for share in SHARES})
    out = []
    for ours, theirs, offset in places(cluster, large.gpus, small.gpus, within):
        for m in counts:
            long, rest = [prompts[i] for i in order[:m]], [prompts[i] for i in order[m:]]
            try:
                a = plan_part(long, large, ours, replace(free, gpus_per_actor=large.gpus))
                b = plan_part(rest, small, theirs, replace(free, gpus_per_actor=small.gpus))
            except PlanError:
                continue
            plan = joined(uids, a, b, offset, unique, config, group_size, billing)
            out.append(replace(plan, floor=whole.floor))
    return out


def places(
    cluster: ClusterSpec, large: int, small: int, within: bool = False
) -> list[tuple[ClusterSpec, ClusterSpec, tuple[int, int]]]:
    """Where a split's two parts may run on uniform nodes, as (the larger actors' GPUs, the
    smaller's, the nodes and GPUs before the smaller's): `NODES` whole nodes of larger actors and,
    where `within`, one or half a node's worth of them on the learner's node, its other GPUs and
    the other nodes left to the smaller. Within a node, a single node's step can still put its
    longest prompts on faster actors (one 8-GPU A100 node, Qwen2.5-3B, LCB at an 8k cap: its
    longest sequence decodes alone in 42 s at TP 2, 32 s at TP 4)."""
    gpn = cluster.gpus_per_node
    out = [
        (replace(cluster, nodes=k), replace(cluster, nodes=cluster.nodes - k), (k, k * gpn))
        for k in NODES
        if k < cluster.nodes and large <= gpn
    ]
    if not within:
        return out
    for j in sorted({1, gpn // large // 2} - {0}):
        taken = j * large
        if gpn - taken < small:
            continue
        rest = (gpn - taken,) + (gpn,) * (cluster.nodes - 1)
        out.append(
            (replace(cluster, nodes=1, gpus_per_node=taken), replace(cluster, node_gpus=rest), (0, taken))
        )
    return out


def joined(
    uids: list[str],
    a: StepPlan,
    b: StepPlan,
    offset: tuple[int, int],
    unique_tokens: int,
    config: SchedulerConfig,
    group_size: int,
    billing: Billing,
) -> StepPlan:
    """Parts `a` (on the first nodes) and `b` (after them) as one step's plan: `b`'s actors moved
    to their nodes and GPUs of the whole cluster (`offset`: the nodes and GPUs before them) and
    numbered after `a`'s; generation ends with the later part and costs both; the rest of the step
    is forecast for both parts' tokens."""
    node_offset, gpu_offset = offset
    # `b` was planned on nodes of its own, its first actor as if on the learner's GPUs: its
    # forecast misses that actor's start and weight load, which the executor then pays.
    for actor in b.actors:
        actor.actor += len(a.actors)
        actor.node += node_offset
        actor.gpu_ids = [g + gpu_offset for g in actor.gpu_ids]
    actors = [*a.actors, *b.actors]
    prompt_tokens = a.prefill["tokens_per_prompt"] + b.prefill["tokens_per_prompt"]
    tokens = sum(x.predicted_tokens for x in actors) + group_size * prompt_tokens
    rest_s, rest_cost = billing.after_generation(tokens, np.array([len(actors)]))
    time_s, cost = max(a.predicted_time, b.predicted_time), a.predicted_cost + b.predicted_cost
    step_time, step_cost = time_s + float(rest_s[0]), cost + float(rest_cost[0])
    computed = a.prefill["tokens_computed"] + b.prefill["tokens_computed"]
    groups = len(a.prefix_groups)
    tree = [
        {
            **node,
            "parent": node["parent"] + len(a.prefix_tree) if node["parent"] >= 0 else -1,
            "group": node["group"] + groups if node["group"] >= 0 else -1,
        }
        for node in b.prefix_tree
    ]
    predicted = {**a.predicted_length, **b.predicted_length}
    return replace(
        a,
        n_actors=len(actors),
        prefix_length=max(a.prefix_length, b.prefix_length),
        unique_prefixes=a.unique_prefixes + b.unique_prefixes,
        prefix_groups=[*a.prefix_groups, *b.prefix_groups],
        prefix_tree=[*a.prefix_tree, *tree],
        actors=actors,
        candidates=[{"n": len(actors), "time": time_s, "cost": cost, "score": 0.0, "hidden": False}],
        predicted_time=time_s,
        predicted_cost=cost,
        prefill={
            **a.prefill,
            "seconds": max(a.prefill["seconds"], b.prefill["seconds"]),
            **{
                key: a.prefill[key] + b.prefill[key]
                for key in ("tokens", "tokens_naive", "tokens_per_prompt", "tokens_computed")
            },
            "tokens_unique": unique_tokens,
            "tree_ratio": computed / unique_tokens if unique_tokens else 1.0,
        },
        predicted_length={u: predicted[u] for u in uids},
        predicted_step_time=step_time,
        predicted_step_cost=step_cost,
        target=target_of(config.budget_per_step, config.deadline_per_step, step_time, step_cost),
        keep_unused_warm=a.keep_unused_warm and b.keep_unused_warm,
        time_cap=None,
        verl_actors=0,
        predicted_mean=None,
        learner_width=0,
        step_options=[],
        pools=[a, b],
    )
