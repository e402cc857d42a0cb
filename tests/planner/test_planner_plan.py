"""plan_step invariants on random workloads, and the baseline policies."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from planner_support import make_cluster, make_profile

from rlhfless.planner.billing import Billing
from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.plan import plan_step
from rlhfless.planner.predictor import LengthPredictor
from rlhfless.planner.pricing import Pricing
from rlhfless.planner.replay import versus_verl
from rlhfless.planner.scaling import TIE, ActorEstimates, candidate_table, choose
from rlhfless.planner.step_plan import PromptSpec, StepPlan

PROFILE = make_profile(step_ms=10.0, per_seq_ms=0.05, prefill_ms_per_token=0.01)


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 30))
    lengths = draw(st.lists(st.integers(1, 2000), min_size=n, max_size=n))
    prompts = [
        PromptSpec(
            f"p{i}", [7, 7, i % 3] + [i] * draw(st.integers(0, 4)), draw(st.none() | st.integers(1, 900))
        )
        for i in range(n)
    ]
    predictor = LengthPredictor()
    for p, length in zip(prompts, lengths, strict=True):
        if length % 3:
            predictor.update(p.uid, [length, max(1, length // 2)])
    return prompts, predictor


def plan(prompts, predictor, **overrides):
    config = SchedulerConfig(**overrides)
    return plan_step(prompts, predictor, PROFILE, make_cluster(), config, group_size=2)


@settings(max_examples=40, deadline=None)
@given(workloads(), st.integers(1, 8), st.sampled_from(["contiguous", "lpt"]), st.booleans())
def test_every_uid_once_and_n_within_bounds(work, n_min, method, sorted_assignment):
    prompts, predictor = work
    p = plan(prompts, predictor, n_min=n_min, assignment_method=method, sorted_assignment=sorted_assignment)
    assigned = [u for a in p.actors for u in a.uids]
    assert sorted(assigned) == sorted(q.uid for q in prompts)
    assert all(a.uids for a in p.actors)
    assert (
        min(n_min, len(prompts), 8)
        <= p.n_actors
        <= min(8, len(prompts))
        == len(p.candidates) + min(n_min, len(prompts), 8) - 1
    )
    assert len(p.actors) == p.n_actors
    assert len({tuple(a.gpu_ids) for a in p.actors}) == p.n_actors


@settings(max_examples=40, deadline=None)
@given(workloads())
def test_sorted_actors_do_not_overlap_in_predicted_length(work):
    prompts, predictor = work
    p = plan(prompts, predictor, backfill=False)
    ranges = sorted(
        (min(p.predicted_length[u] for u in a.uids), max(p.predicted_length[u] for u in a.uids))
        for a in p.actors
    )
    for (_, hi), (lo, _) in zip(ranges, ranges[1:], strict=False):
        assert hi <= lo


@settings(max_examples=40, deadline=None)
@given(workloads(), st.sampled_from(["relative", "range"]))
def test_lam_one_is_fastest_and_lam_zero_cheapest(work, normalise):
    prompts, predictor = work
    fast = plan(prompts, predictor, lam=1.0, normalise=normalise, max_slowdown=None)
    cheap = plan(prompts, predictor, lam=0.0, normalise=normalise, max_slowdown=None)
    assert fast.predicted_time == min(c["time"] for c in fast.candidates)
    assert cheap.predicted_cost == min(c["cost"] for c in cheap.candidates)


@settings(max_examples=40, deadline=None)
@given(workloads(), st.floats(0.5, 60.0), st.floats(1.0, 1.3))
def test_the_executors_own_seconds_count_on_the_even_split_as_on_every_candidate(work, overhead, slowdown):
    """`max_slowdown` admits the N predicted at most that much slower than an even split over
    every actor. The executor's measured overhead is on every candidate's time, and an even split
    pays it too, so it never shuts a cheaper N out: cost-first (lam 0), it takes no dearer N."""
    prompts, predictor = work
    config = SchedulerConfig(lam=0.0, max_slowdown=slowdown)
    chosen = []
    for seconds in (0.0, overhead):
        billing = Billing(Pricing(3600.0), overhead_s=seconds)
        chosen.append(plan_step(prompts, predictor, PROFILE, make_cluster(), config, 2, billing).n_actors)
    assert chosen[1] <= chosen[0]


@settings(max_examples=40, deadline=None)
@given(workloads(), st.floats(0.5, 60.0), st.floats(1.0, 1.3))
def test_the_wait_for_the_learners_own_decode_function_is_on_verls_time_as_on_every_candidate(
    work, wait, slowdown
):
    """On a run's first step every plan, verl's as well, waits the rest of the start of the decode
    function on the learner's resources (slot 0): a candidate's time grows by at most that wait,
    and the cap at verl's time by exactly that, so an N the cap admitted stays admitted. A plan
    balances its chosen N further than the others, weighing alternatives whose scores the wait
    is in (a replayed example: both plans chose N = 2 and their balancing differed by 0.077 s),
    so only the Ns neither plan chose are compared."""
    prompts, predictor = work
    config = SchedulerConfig(lam=0.0, max_slowdown=slowdown)
    plans = [
        plan_step(
            prompts,
            predictor,
            PROFILE,
            make_cluster(),
            config,
            2,
            Billing(Pricing(3600.0), resident_units=1.0, host_start_s=seconds),
        )
        for seconds in (0.0, wait)
    ]
    before, after = ({c["n"]: c["time"] for c in p.candidates} for p in plans)
    chosen = {p.n_actors for p in plans}
    alike = [n for n in before.keys() & after.keys() if n not in chosen]
    assume(alike)  # no candidate but the chosen: none balanced alike
    assert all(after[n] <= before[n] + wait + 1e-9 for n in alike)
    if plans[0].time_cap is not None and plans[1].time_cap is not None:
        assert plans[1].time_cap == pytest.approx(plans[0].time_cap + slowdown * wait)


@settings(max_examples=40, deadline=None)
@given(workloads(), st.sampled_from([0.0, 0.7]))
def test_lam_never_takes_a_plan_predicted_slower_than_verls_own(work, lam):
    """`max_slowdown=1`: the chosen N's generation is predicted no slower than the verl policy's
    plan of the same step (equal prompt counts in input order on every actor, no dedup), unless
    no N is (then the fastest, or a tie with it: within `TIE`)."""
    prompts, predictor = work
    billing = Billing(Pricing(3600.0), handoff=True, overhead_s=1.5)
    plans = {
        policy: plan_step(
            prompts, predictor, PROFILE, make_cluster(), SchedulerConfig(policy=policy, lam=lam), 2, billing
        )
        for policy in ("rlhfless", "verl")
    }
    fastest = min(c["time"] for c in plans["rlhfless"].candidates)
    assert plans["rlhfless"].predicted_time <= max(plans["verl"].predicted_time, fastest * (1 + TIE)) + 1e-9


@settings(max_examples=40, deadline=None)
@given(workloads(), st.floats(1.0, 1.2))
def test_a_run_whose_forecasts_fell_short_of_verls_caps_its_plans_that_much_below_verl(work, shortfall):
    """A run whose plans' forecasts have lately fallen `shortfall` times further short than verl's
    (`Billing.generation_shortfall`) takes a plan forecast that much faster than verl's, unless no
    N is (then the fastest, or a tie with it: within `TIE`)."""
    prompts, predictor = work
    billing = Billing(Pricing(3600.0), handoff=True, overhead_s=1.5, generation_shortfall=shortfall)
    plans = {
        policy: plan_step(
            prompts, predictor, PROFILE, make_cluster(), SchedulerConfig(policy=policy, lam=0.0), 2, billing
        )
        for policy in ("rlhfless", "verl")
    }
    ours, fastest = plans["rlhfless"].predicted_time, min(c["time"] for c in plans["rlhfless"].candidates)
    tied = ours <= fastest * (1 + TIE)
    assert ours * shortfall <= plans["verl"].predicted_time + 1e-9 or tied
    cap = plans["rlhfless"].time_cap  # recorded (None: lam took the fastest N, no cap was needed)
    if cap is None:
        assert ours == fastest
    else:  # verl's own plan adds its start delays to the same model's time
        assert cap <= plans["verl"].predicted_time / shortfall + 1e-9 and (ours <= cap + 1e-9 or tied)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(1, 500), min_size=2, max_size=2), min_size=2, max_size=24))
def test_a_plan_whose_lengths_came_as_predicted_fell_no_further_short_than_verls(lengths):
    """`versus_verl` times the plan and verl's even split at the predicted lengths and at the
    observed ones; told the truth, the predictor leaves the two equal."""
    predictor = LengthPredictor(mode="oracle")
    uids = [f"p{i}" for i in range(len(lengths))]
    for uid, sample in zip(uids, lengths, strict=True):
        predictor.reveal(uid, sample)
    prompts = [PromptSpec(uid, [1, 2, 3 + i], None) for i, uid in enumerate(uids)]
    config = SchedulerConfig(dedup_prefill=False, lam=0.0)
    plan = plan_step(prompts, predictor, PROFILE, make_cluster(), config, 2)
    tokens = np.array([len(p.prompt_tokens) for p in prompts], dtype=float)
    versus = versus_verl(plan, np.array(lengths, dtype=float), tokens, PROFILE)
    if plan.verl_actors:  # capped: lam's cheapest plan was slower than the fastest
        assert versus is not None and versus[1] == pytest.approx(versus[0])
    else:
        assert versus is None


@settings(max_examples=25, deadline=None)
@given(workloads(), st.sampled_from(["rlhfless", "verl", "rlhfuse"]))
def test_same_input_same_plan(work, policy):
    prompts, predictor = work
    a, b = plan(prompts, predictor, policy=policy), plan(prompts, predictor, policy=policy)
    da, db = a.to_dict(), b.to_dict()
    da.pop("plan_seconds"), db.pop("plan_seconds")
    assert da == db


@st.composite
def long_prompts(draw):
    """Prompts past the dedup's first chunk (64 tokens): shared system prompts of 0-150 tokens,
    some prompts repeated, so that ties are read chunk after chunk."""
    systems = draw(st.lists(st.integers(0, 150), min_size=1, max_size=3))
    n = draw(st.integers(1, 24))
    rows = []
    for _ in range(n):
        system = [7] * systems[draw(st.integers(0, len(systems) - 1))]
        if rows and draw(st.booleans()):
            rows.append(list(rows[draw(st.integers(0, len(rows) - 1))]))
        else:
            rows.append(system + draw(st.lists(st.integers(0, 3), max_size=80)))
    return rows


def tree_tokens_brute_force(rows):
    return len({tuple(r[:k]) for r in rows for k in range(1, len(r) + 1)})


@settings(max_examples=30, deadline=None)
@given(long_prompts(), st.sampled_from(["rlhfless", "verl"]), st.sampled_from([1, 4, 256]))
def test_plan_is_the_same_from_token_lists_and_arrays(rows, policy, capacity):
    """The runtime hands Python lists, the simulator numpy arrays: one plan, whatever the form."""
    predictor = LengthPredictor()
    for i in range(0, len(rows), 2):
        predictor.update(f"p{i}", [10 + 37 * i % 500, 5])
    plans = []
    for form in (list, lambda r: np.array(r, dtype=np.int32), lambda r: np.array(r, dtype=np.uint32)):
        prompts = [PromptSpec(f"p{i}", form(r), 40) for i, r in enumerate(rows)]
        d = plan(prompts, predictor, policy=policy, prefill_capacity=capacity).to_dict()
        d.pop("plan_seconds")
        plans.append(d)
    assert plans[0] == plans[1] == plans[2]
    assert plans[0]["prefill"]["tokens_unique"] == tree_tokens_brute_force(rows)


def test_verl_uses_every_gpu_with_an_even_split_and_no_dedup():
    prompts = [PromptSpec(f"p{i}", [1, 2, 3, i]) for i in range(16)]
    p = plan(prompts, LengthPredictor(), policy="verl")
    assert p.n_actors == 8 and [len(a.uids) for a in p.actors] == [2] * 8
    assert p.actors[0].uids == ["p0", "p1"]
    assert p.prefix_length == 0 and p.cut == "none"
    assert p.prefill["tokens_computed"] == p.prefill["tokens_naive"] == 2 * 16 * 4
    assert plan(prompts, LengthPredictor(), policy="rlhfuse").cut == "global"


def test_heaviest_actor_sits_with_the_learner_and_remote_ones_wait_for_weights():
    prompts = [PromptSpec(f"p{i}", [1, 2, i]) for i in range(16)]
    predictor = LengthPredictor()
    for i, q in enumerate(prompts):
        predictor.update(q.uid, [10 * (i + 1)])
    p = plan(prompts, predictor, actor_scaling=False)
    heaviest = max(p.actors, key=lambda a: a.predicted_time - a.start_delay)
    assert heaviest.gpu_ids == [0] and heaviest.node == 0
    assert heaviest.start_delay == p.prefill["seconds"]
    remote = [a for a in p.actors if a.node == 1]
    assert remote and all(a.start_delay >= 10**9 / make_cluster().inter_node_bandwidth for a in remote)

    # On GPUs the learner hands over (the simulator's), the new weights are there: none stream.
    config = SchedulerConfig(actor_scaling=False)
    billing = Billing(config.pricing, handoff=True)
    first = plan_step(prompts, predictor, PROFILE, make_cluster(), config, 2, billing)
    remote = [a for a in first.actors if a.node == 1]
    assert remote and all(a.start_delay < 10**9 / make_cluster().inter_node_bandwidth for a in remote)


def test_dedup_feeds_the_prefill_actor():
    prompts = [PromptSpec(f"p{i}", list(range(40)) + [i]) for i in range(10)]
    p = plan(prompts, LengthPredictor(), prefill_capacity=1)
    assert p.prefix_length == 40 and p.unique_prefixes == 1
    assert p.prefill["tokens"] == 40 and p.prefill["tokens_computed"] == 40 + 10
    without = plan(prompts, LengthPredictor(), dedup_prefill=False)
    assert without.prefill["tokens_computed"] == 2 * 10 * 41


def test_plan_reports_each_prompts_prefix_kv_and_the_tokens_against_the_tree():
    """A plan's prefix tree says what each prompt receives (its longest prefix shared with
    another, less its last token); a plan read back from before the tree gets min(L, len - 1)."""
    system = list(range(50, 80))
    rows = [system + [1, 2, i] for i in range(4)] + [system + [3, i] for i in range(4)] + [[9, 9]]
    prompts = [PromptSpec(f"p{i}", r) for i, r in enumerate(rows)]
    p = plan(prompts, LengthPredictor())
    lengths = np.array([len(r) for r in rows])
    assert p.prefix_tokens([q.uid for q in prompts], lengths).tolist() == [32] * 4 + [31] * 4 + [0]
    assert sorted((n["start"], n["end"]) for n in p.prefix_tree) == [(0, 30), (30, 31), (30, 32)]
    assert p.prefill["rule"] == "tree" and p.prefill["tokens"] == 30 + 1 + 2
    assert p.prefill["tokens_computed"] == p.prefill["tokens_unique"] and p.prefill["tree_ratio"] == 1.0
    old = StepPlan.from_dict({**p.to_dict(), "prefix_tree": [], "prefix_length": 31})
    assert old.prefix_tokens(["p0", "p8"], np.array([33, 2])).tolist() == [31, 1]
    without = plan(prompts, LengthPredictor(), dedup_prefill=False)
    assert without.prefix_tokens(["p0"], lengths[:1]).tolist() == [0] and without.prefix_tree == []


def test_config_rejects_out_of_range_values_by_name():
    for field, value, message in (
        ("prefix_rule", "trie", "prefix_rule: got 'trie', expected one of tree, paper"),
        ("tau", 1.5, "tau: got 1.5, expected a number in (0, 1]"),
        ("policy", "x", "policy: got 'x'"),
        ("lam", -1, "lam: got -1"),
    ):
        try:
            SchedulerConfig(**{field: value})
        except ValueError as err:
            assert str(err).startswith(message)
        else:
            raise AssertionError(f"{field}={value} accepted")
    assert all(f.metadata.get("help") for f in dataclasses.fields(SchedulerConfig))
    assert np.isclose(SchedulerConfig().tau, 0.7)


@settings(max_examples=40, deadline=None)
@given(
    workloads(),
    st.sampled_from(["rlhfless", "verl"]),
    st.integers(1, 4),
    st.sampled_from(["contiguous", "lpt"]),
)
def test_prompt_tokens_computed_are_the_prefill_actor_plus_every_decode_actor(work, policy, capacity, method):
    prompts, predictor = work
    p = plan(prompts, predictor, policy=policy, prefill_capacity=capacity, assignment_method=method)
    own = sum(a.prefill_tokens for a in p.actors)
    assert p.prefill["tokens_computed"] == p.prefill["tokens"] + own
    total = sum(len(q.prompt_tokens) for q in prompts)
    assert p.prefill["tokens_per_prompt"] == total and p.prefill["tokens_naive"] == 2 * total
    if policy == "verl":
        assert p.prefill["tokens"] == 0 and p.prefill["tokens_computed"] == 2 * total
    else:
        assert p.prefill["tokens_computed"] <= total


def _estimates(times, costs):
    n = np.arange(1, len(times) + 1)
    one = np.ones(len(times))
    return ActorEstimates(
        n,
        0 * n,
        n,
        np.array(times, float),
        np.array(costs, float),
        0 * n,
        0 * one,
        one > 0,
        one,
        one,
        0 * one,
        one,
    )


BILLING = Billing(Pricing(1.0))
ONE_GPU = SimpleNamespace(gpus=1, cold_start_s=0.0)


def _table(actors, normalise):
    return candidate_table(actors, BILLING, False, 0.7, normalise, ONE_GPU)


def test_range_normalisation_lets_a_tiny_cost_spread_outweigh_a_large_time_gain():
    # N = 1 is very slow; N = 2..4 differ by 2% in cost and 40% in time.
    actors = _estimates([1000.0, 140.0, 120.0, 100.0], [100.0, 100.0, 101.0, 102.0])
    paper = _table(actors, "range")
    relative = _table(actors, "relative")
    assert paper.n[choose(paper)] == 2  # 40% slower than N = 4 to save 2%
    assert relative.n[choose(relative)] == 4
    np.testing.assert_allclose(
        relative.score, 0.7 * np.array([9.0, 0.4, 0.2, 0.0]) + 0.3 * np.array([0, 0, 0.01, 0.02])
    )
