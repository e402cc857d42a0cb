"""The plan's prefix levels over a step's prompts, as both executors hand them to the engine, and
what the step's prefill computed against the least it could (the prefix tree's unique tokens)."""

from __future__ import annotations

from rlhfless.engine import PrefixTree
from rlhfless.planner import StepPlan
from rlhfless.runtime.samples import StepPrompt


def prefix_tree(plan: StepPlan, prompts: list[StepPrompt]) -> PrefixTree | None:
    """`plan.prefix_tree` with each node's tokens (read from a prompt below it); None when the plan
    does not deduplicate, so that every sample prefills its own prompt."""
    if not plan.features.get("dedup_prefill"):
        return None
    ids = {p.uid: p.prompt_ids for p in prompts}
    nodes, groups = plan.prefix_tree, plan.prefix_groups
    below = [groups[n["group"]][0] if n["group"] >= 0 else "" for n in nodes]
    for i in reversed(range(len(nodes))):  # a branch node reads its tokens from a child's prompt
        parent = nodes[i]["parent"]
        if parent >= 0 and not below[parent]:
            below[parent] = below[i]
    return PrefixTree(
        [list(ids[uid][: n["end"]]) for uid, n in zip(below, nodes, strict=True)],
        [n["parent"] for n in nodes],
        {uid: i for i, n in enumerate(nodes) if n["group"] >= 0 for uid in groups[n["group"]]},
    )


def prefill_metrics(plan: StepPlan, computed: float) -> dict[str, float]:
    """`prefill/tokens_unique` (the step's prefix tree) and `prefill/tree_ratio`: prompt tokens
    computed per unique one (1.0 is the least)."""
    unique = float(plan.prefill.get("tokens_unique", 0))
    return {"prefill/tokens_unique": unique, "prefill/tree_ratio": computed / unique if unique else 1.0}
