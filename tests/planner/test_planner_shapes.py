"""Decode actor shapes as a plan dimension: `plan_shapes` plans each tensor-parallel size as
`plan_step` would and takes one, by the same rules that choose N within a shape."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planner_support import make_cluster, make_profile

from rlhfless.planner.billing import Billing
from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.placement import ClusterSpec
from rlhfless.planner.plan import plan_step
from rlhfless.planner.pools import latency_bound, places, split_plans
from rlhfless.planner.predictor import LengthPredictor
from rlhfless.planner.pricing import Pricing
from rlhfless.planner.scaling import PlanError
from rlhfless.planner.sizes import plan_shapes
from rlhfless.planner.step_plan import PromptSpec
from rlhfless.planner.timemodel import Workload
from rlhfless.planner.verl_time import verl_cap, verl_workload

# One GPU a step, or two GPUs that decode each step faster and hold as many sequences.
ONE = make_profile(step_ms=10.0, per_seq_ms=0.05, prefill_ms_per_token=0.01)
TWO = dataclasses.replace(make_profile(step_ms=6.0, per_seq_ms=0.02, prefill_ms_per_token=0.005), gpus=2)
SHAPES = [ONE, TWO]


@st.composite
def steps(draw):
    n = draw(st.integers(2, 24))
    lengths = draw(st.lists(st.integers(1, 2000), min_size=n, max_size=n))
    prompts = [PromptSpec(f"p{i}", [7, 7, i % 3, i]) for i in range(n)]
    predictor = LengthPredictor()
    for p, length in zip(prompts, lengths, strict=True):
        predictor.update(p.uid, [length, max(1, length // 3)])
    return prompts, predictor


def own_plans(prompts, predictor, config):
    """Each shape's plan on its own, its floor the best of both shapes."""
    return [
        plan_step(
            prompts,
            predictor,
            p,
            make_cluster(),
            dataclasses.replace(config, gpus_per_actor=p.gpus),
            2,
            floor_shapes=SHAPES,
        )
        for p in SHAPES
    ]


def decision(plan):
    return {k: v for k, v in plan.to_dict().items() if k not in ("plan_seconds", "shape_options")}


@settings(max_examples=30, deadline=None)
@given(steps(), st.sampled_from(["lam", "budget_per_step", "deadline_per_step"]), st.floats(0.0, 1.0))
def test_the_plan_is_one_shapes_own_and_the_one_its_target_or_lam_takes(step, target, lam):
    prompts, predictor = step
    config = SchedulerConfig(lam=lam, target_miss="nearest", split_sizes=False)
    if target != "lam":  # a target between the two shapes' lam plans: one may fit it, or both
        lam_plans = own_plans(prompts, predictor, config)
        key = "predicted_step_cost" if target == "budget_per_step" else "predicted_step_time"
        config = dataclasses.replace(config, **{target: float(np.mean([getattr(p, key) for p in lam_plans]))})
    own = own_plans(prompts, predictor, config)
    got = plan_shapes(prompts, predictor, SHAPES, make_cluster(), config, 2)

    taken = [i for i, p in enumerate(own) if decision(p) == decision(got)]
    assert len(taken) == 1 or decision(own[0]) == decision(own[1])
    assert {a.gpus for a in got.actors} == {SHAPES[taken[0]].gpus}
    assert sorted(u for a in got.actors for u in a.uids) == sorted(p.uid for p in prompts)
    assert [o["gpus"] for o in got.shape_options] == [1, 2]
    assert [o["step_time"] for o in got.shape_options] == [p.predicted_step_time for p in own]

    time = np.array([p.predicted_step_time for p in own])
    cost = np.array([p.predicted_step_cost for p in own])
    fits = np.array([not p.target.get("missed") for p in own])
    if target == "budget_per_step":
        best = time[fits].min() if fits.any() else None
        assert got.predicted_step_time == best if best is not None else got.predicted_step_cost == cost.min()
    elif target == "deadline_per_step":
        best = cost[fits].min() if fits.any() else None
        assert got.predicted_step_cost == best if best is not None else got.predicted_step_time == time.min()
    else:
        score = lam * (time / time.min() - 1) + (1 - lam) * (cost / cost.min() - 1)
        assert score[taken[0]] == pytest.approx(score.min())


def test_one_shape_is_plan_step_itself():
    prompts = [PromptSpec(f"p{i}", [1, 2, i]) for i in range(6)]
    config = SchedulerConfig(gpus_per_actor=2)
    alone = plan_shapes(prompts, LengthPredictor(), [TWO], make_cluster(), config, 2)
    assert decision(alone) == decision(plan_step(prompts, LengthPredictor(), TWO, make_cluster(), config, 2))
    assert alone.shape_options == []


def test_a_target_no_shape_meets_names_the_least_any_shape_could():
    prompts = [PromptSpec(f"p{i}", [1, 2, i]) for i in range(6)]
    config = SchedulerConfig(budget_per_step=1e-9)
    least = []
    for profile in SHAPES:
        with pytest.raises(PlanError) as refused:
            plan_step(
                prompts,
                LengthPredictor(),
                profile,
                make_cluster(),
                dataclasses.replace(config, gpus_per_actor=profile.gpus),
                2,
            )
        least.append(refused.value.least)
    with pytest.raises(PlanError, match="budget_per_step: got 1e-09") as refused:
        plan_shapes(prompts, LengthPredictor(), SHAPES, make_cluster(), config, 2)
    assert refused.value.least == min(least)


CLUSTER = ClusterSpec(nodes=4, gpus_per_node=4, model_bytes=10**9, kv_bytes_per_token=1000)


def assert_whole(plan):
    """Every prompt once, actors numbered in order, no GPU twice, all on the cluster."""
    assert sorted(u for a in plan.actors for u in a.uids) == sorted(plan.predicted_length)
    assert [a.actor for a in plan.actors] == list(range(plan.n_actors))
    gpus = [g for a in plan.actors for g in a.gpu_ids]
    assert len(gpus) == len(set(gpus)) and max(gpus) < CLUSTER.total_gpus


def splits_of(step, lam, cluster, within=False):
    """(ONE's plan of the whole step, `split_plans` of TWO for the longest prompts and ONE for the
    rest), each part planned by `plan_step`."""
    prompts, predictor = step
    config = SchedulerConfig(lam=lam)
    gmax, _ = predictor.predict([p.uid for p in prompts])

    def part(subset, profile, nodes, cfg):
        return plan_step(subset, predictor, profile, nodes, cfg, 2, floor_shapes=SHAPES)

    whole = part(prompts, ONE, cluster, config)
    return whole, split_plans(
        prompts, gmax, TWO, ONE, cluster, config, 2, Billing(config.pricing), whole, part, within
    )


@settings(max_examples=25, deadline=None)
@given(steps(), st.floats(0.0, 1.0))
def test_every_split_holds_the_longest_prompts_on_the_largest_size_and_every_prompt_once(step, lam):
    whole, splits = splits_of(step, lam, CLUSTER)
    assert splits  # 4 nodes: every split tried plans
    for plan in splits:
        assert_whole(plan)
        large, small = plan.pools
        assert {a.gpus for a in large.actors} == {2} and {a.gpus for a in small.actors} == {1}
        assert max(a.node for a in large.actors) < min(a.node for a in small.actors)
        shortest_long = min(plan.predicted_length[u] for u in large.predicted_length)
        assert all(plan.predicted_length[u] <= shortest_long for u in small.predicted_length)
        assert plan.predicted_time == max(large.predicted_time, small.predicted_time)
        assert plan.predicted_cost == pytest.approx(large.predicted_cost + small.predicted_cost)
        assert plan.actors == [*large.actors, *small.actors] and plan.floor == whole.floor


@settings(max_examples=20, deadline=None)
@given(steps(), st.floats(0.0, 1.0))
def test_a_split_is_taken_only_where_it_beats_every_single_size(step, lam):
    prompts, predictor = step
    config = SchedulerConfig(lam=lam)
    got = plan_shapes(prompts, predictor, SHAPES, CLUSTER, config, 2)
    assert_whole(got)
    singles = [o for o in got.shape_options if "pools" not in o]
    assert [o["gpus"] for o in singles] == [1, 2] and len(got.shape_options) <= 3
    t = np.array([o["step_time"] for o in got.shape_options])
    c = np.array([o["step_cost"] for o in got.shape_options])
    score = lam * (t / t.min() - 1) + (1 - lam) * (c / c.min() - 1)
    mine = lam * (got.predicted_step_time / t.min() - 1) + (1 - lam) * (got.predicted_step_cost / c.min() - 1)
    assert mine == pytest.approx(score.min())
    assert bool(got.pools) == (len(got.shape_options) == 3 and int(np.argmin(score)) == 2)


def test_a_split_runs_on_whole_nodes_or_within_the_learners_node():
    two_nodes = ClusterSpec(nodes=2, gpus_per_node=8)
    whole, within = places(two_nodes, large=4, small=2, within=True)
    assert (whole[0].nodes, whole[1].nodes, whole[2]) == (1, 1, (1, 8))
    # one 4-GPU actor on the learner's node; its other 4 GPUs and the second node for the bulk
    assert (within[0].nodes, within[0].total_gpus) == (1, 4)
    assert (within[1].node_gpus, within[2]) == ((4, 8), (0, 4))
    assert places(two_nodes, large=4, small=2) == [whole]
    # one or half a node's worth of 2-GPU actors; none of 8 GPUs, which leave the node nothing
    one_node = ClusterSpec(nodes=1, gpus_per_node=8)
    assert [p[0].total_gpus for p in places(one_node, large=2, small=1, within=True)] == [2, 4]
    assert places(one_node, large=8, small=4, within=True) == []


ONE_NODE = ClusterSpec(nodes=1, gpus_per_node=8, model_bytes=10**9, kv_bytes_per_token=1000)


@settings(max_examples=25, deadline=None)
@given(steps(), st.floats(0.0, 1.0))
def test_a_split_within_a_node_gives_the_larger_actors_its_first_gpus_and_the_bulk_the_rest(step, lam):
    assert splits_of(step, lam, ONE_NODE)[1] == []  # one node: no whole node to give the larger actors
    _, splits = splits_of(step, lam, ONE_NODE, within=True)
    assert splits
    for plan in splits:
        assert sorted(u for a in plan.actors for u in a.uids) == sorted(plan.predicted_length)
        large, small = plan.pools
        taken = sum(a.gpus for a in large.actors)
        assert {a.node for a in plan.actors} == {0}
        assert all(g < taken for a in large.actors for g in a.gpu_ids)
        gpus = [g for a in small.actors for g in a.gpu_ids]
        assert len(gpus) == len(set(gpus)) and min(gpus) >= taken and max(gpus) < 8
        shortest_long = min(plan.predicted_length[u] for u in large.predicted_length)
        assert all(plan.predicted_length[u] <= shortest_long for u in small.predicted_length)


def test_on_one_node_no_split_puts_the_bulk_on_actors_smaller_than_the_best_single_size():
    """One long prompt among ten short ones: the wide actors are the best single size, and a
    split would leave the bulk on narrow ones, where a sequence that outruns its prediction would
    set the step's end with no wide actor of its part to move to. On one node none is weighed."""
    prompts = [PromptSpec(f"p{i}", [7, 7, i]) for i in range(11)]
    predictor = LengthPredictor()
    for i, p in enumerate(prompts):
        predictor.update(p.uid, [2000, 1900] if i == 0 else [100, 90])
    got = plan_shapes(prompts, predictor, [NARROW, WIDE], ONE_NODE, SchedulerConfig(lam=1.0), 2)
    times = {o["gpus"]: o["step_time"] for o in got.shape_options}
    assert times[2] < times[1] and got.split_versus is None and not got.pools
    assert {a.gpus for a in got.actors} == {2}


def test_one_long_prompt_on_one_node_runs_on_larger_actors_than_the_bulk():
    prompts, predictor = long_and_bulk()
    got = plan_shapes(prompts, predictor, [NARROW, WIDE], ONE_NODE, SchedulerConfig(lam=1.0), 2)
    singles = [o["step_time"] for o in got.shape_options if "pools" not in o]
    assert got.pools and got.predicted_step_time < min(singles)
    assert "p0" in got.pools[0].predicted_length and {a.gpus for a in got.pools[0].actors} == {2}


def test_a_split_is_weighed_only_where_the_smaller_size_would_wait_on_its_longest_sequence():
    def bound(lengths, actors):
        n = len(lengths)
        group_max = np.asarray(lengths, dtype=float)
        return latency_bound(ONE, np.full(n, 10.0), group_max, group_max / 2, 4, actors, Pricing(1.0))

    # One 2,000-token sequence among short ones on many actors: its decode alone sets the end.
    assert bound([2000] + [50] * 99, actors=16)
    # A hundred long groups on one actor: their tokens, not any one sequence, set it.
    assert not bound([2000] * 100, actors=1)


# Actors of two GPUs decode each token sooner, but their step grows fast with the batch: alone
# they are bound by the bulk's tokens, one GPU alone by the longest sequence.
NARROW = make_profile(step_ms=10.0, per_seq_ms=0.05)
WIDE = dataclasses.replace(make_profile(step_ms=6.0, per_seq_ms=0.2), gpus=2)


def long_and_bulk():
    """One prompt of 2,000 tokens among 400 of 500."""
    prompts = [PromptSpec(f"p{i}", [7, 7, i]) for i in range(401)]
    predictor = LengthPredictor()
    for i, p in enumerate(prompts):
        predictor.update(p.uid, [2000, 1900] if i == 0 else [500, 480])
    return prompts, predictor


def test_a_deadline_no_single_size_meets_is_met_by_a_split_that_does():
    prompts, predictor = long_and_bulk()
    shapes = [NARROW, WIDE]
    fast = plan_shapes(prompts, predictor, shapes, CLUSTER, SchedulerConfig(lam=1.0), 2)
    singles = [o["step_time"] for o in fast.shape_options if "pools" not in o]
    assert fast.pools and fast.predicted_step_time < 0.95 * min(singles)
    config = SchedulerConfig(lam=1.0, deadline_per_step=0.5 * (fast.predicted_step_time + min(singles)))
    for profile in shapes:  # alone, neither size meets it
        with pytest.raises(PlanError):
            shaped = dataclasses.replace(config, gpus_per_actor=profile.gpus)
            plan_step(prompts, predictor, profile, CLUSTER, shaped, 2)
    got = plan_shapes(prompts, predictor, shapes, CLUSTER, config, 2)
    assert got.pools and got.predicted_step_time <= config.deadline_per_step
    assert got.target == {"deadline_per_step": config.deadline_per_step, "missed": 0.0}
    assert_whole(got)


def test_under_a_deadline_a_splits_parts_may_be_cheaper_than_lam_would_plan_them():
    prompts, predictor = long_and_bulk()
    shapes = [NARROW, WIDE]
    fast = plan_shapes(prompts, predictor, shapes, CLUSTER, SchedulerConfig(lam=1.0), 2)
    assert fast.pools
    # lam 1 plans the bulk's part on more actors than the deadline needs: the cheapest split within
    # it has parts planned at a lower lam
    config = SchedulerConfig(lam=1.0, deadline_per_step=1.05 * fast.predicted_step_time)
    got = plan_shapes(prompts, predictor, shapes, CLUSTER, config, 2)
    assert got.pools and got.predicted_step_time <= config.deadline_per_step
    assert got.predicted_step_cost < fast.predicted_step_cost
    assert_whole(got)


@settings(max_examples=30, deadline=None)
@given(steps(), st.floats(0.0, 1.0))
def test_lam_over_sizes_is_never_slower_than_verl_at_verls_own_size(step, lam):
    """verl runs at `baseline` (TWO): lam's plan, whatever size or split it takes, is within
    verl's generation time there (max_slowdown 1) wherever an option reaches it. Each size timed
    against its own even split instead let low lams take ONE at 1.6x verl's time."""
    prompts, predictor = step
    config = SchedulerConfig(lam=lam)
    got = plan_shapes(prompts, predictor, SHAPES, make_cluster(), config, 2, baseline=TWO)
    gmax, gmean = predictor.predict([p.uid for p in prompts], [None] * len(prompts), [None] * len(prompts))
    lengths = np.array([len(p.prompt_tokens) for p in prompts], dtype=float)
    verl = verl_workload(Workload(gmax, gmean, lengths, lengths * 0, lengths * 0, 2))
    n = min(make_cluster().max_actors(TWO.gpus), len(prompts))
    cap = verl_cap(verl, n, TWO, config.segments, 1.0, Billing(config.pricing))
    times = [o["time"] for o in got.shape_options]
    if min(times) <= cap * (1 + 1e-9):
        assert got.predicted_time <= cap * (1 + 1e-9)
    else:  # no size reaches verl's time: the fastest
        assert got.predicted_time == min(times)


def test_a_split_taken_is_compared_with_verl_at_verls_size_too():
    """The run's shortfall against verl learns from every plan taken: a split's parts are timed
    each at its own size, verl at its own (where a split gave nothing before). At observed
    lengths equal to the predicted ones, the two quotients agree."""
    from rlhfless.planner.replay import versus_verl

    prompts = [PromptSpec(f"p{i}", [7, 7, i % 3, i]) for i in range(2)]
    predictor = LengthPredictor()
    for p, length in zip(prompts, [299, 1026], strict=True):
        predictor.update(p.uid, [length, max(1, length // 3)])
    got = plan_shapes(prompts, predictor, SHAPES, make_cluster(), SchedulerConfig(lam=0.93), 2, baseline=TWO)
    assert got.pools and got.verl_actors == min(make_cluster().max_actors(TWO.gpus), 2)
    observed = np.array([[299, 99], [1026, 342]])  # each group's max and mean as predicted
    predicted, seen = versus_verl(got, observed, np.array([4.0, 4.0]), ONE, verl_profile=TWO)
    assert predicted == pytest.approx(seen) and predicted > 0


def test_a_split_weighed_is_kept_beside_the_best_single_size_and_learns_where_it_fell_short():
    """The run learns how a split fares against the best single size from the step's own
    lengths (`versus_single`): the bulk's part was planned for 500-token groups, and one that ran
    to 2,000 tokens sets its end on the narrow actors, where on the wide ones it would not."""
    from rlhfless.planner.replay import versus_single

    prompts, predictor = long_and_bulk()
    got = plan_shapes(prompts, predictor, [NARROW, WIDE], CLUSTER, SchedulerConfig(lam=1.0), 2)
    split, single = got.split_versus
    assert got.pools and split.actors == got.actors and not single.pools
    assert len(got.predicted_mean) == len(prompts)
    tokens = np.full(len(prompts), 3.0)
    observed = np.array([[2000, 1900]] + [[500, 480]] * 400)  # each group's max and mean as predicted
    predicted, seen = versus_single(split, single, got.predicted_mean, observed, tokens, NARROW)
    assert predicted == pytest.approx(seen) and predicted < 1.0
    observed[200] = [2000, 1900]  # a bulk group on a narrow actor, predicted 500
    _, longer = versus_single(split, single, got.predicted_mean, observed, tokens, NARROW)
    assert longer > 1.05 * seen  # 1.10x (1.33x before the ranges were settled, `balance.settle`)


def test_a_split_is_weighed_with_its_generation_stretched_by_how_far_splits_fell_short():
    prompts, predictor = long_and_bulk()
    shapes, config = [NARROW, WIDE], SchedulerConfig(lam=1.0)
    fast = plan_shapes(prompts, predictor, shapes, CLUSTER, config, 2)
    singles = [o for o in fast.shape_options if "pools" not in o]
    best = min(singles, key=lambda o: o["step_time"])
    gain = (best["step_time"] - fast.predicted_step_time) / fast.predicted_time  # the split's lead
    for stretch, split in ((1 + 0.9 * gain, True), (1 + 1.1 * gain, False)):
        got = plan_shapes(
            prompts, predictor, shapes, CLUSTER, config, 2, Billing(config.pricing, split_shortfall=stretch)
        )
        assert bool(got.pools) == split
        assert got.split_versus is not None  # weighed either way, so the run keeps learning
    assert got.predicted_step_time == best["step_time"]  # its forecast as planned, not stretched
