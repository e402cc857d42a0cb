"""One pricing model: the planner's forecast, the runtime's meter and the simulator's bill agree on
every invocation, and the billing rules (cold start, keep-alive) mean the same in all three."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planner_support import make_cluster, make_profile

from rlhfless.planner.billing import Billing, LearningWidth
from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.plan import plan_step
from rlhfless.planner.predictor import LengthPredictor
from rlhfless.planner.pricing import PRICE_SHEETS, Pricing, charge, keep_warm
from rlhfless.planner.scaling import PlanError, choose
from rlhfless.planner.step_plan import PromptSpec
from rlhfless.runtime.billing import Invocation, Meter
from rlhfless.sim.config import build
from rlhfless.sim.runner import run_policy

RULES = [Pricing(1.95), Pricing(1.95, bill_cold_start=False), Pricing(1.95, bill_keep_alive=False)]


@settings(max_examples=50, deadline=None)
@given(
    units=st.floats(0, 16),
    seconds=st.floats(0, 1e4),
    cold=st.floats(0, 100),
    idle=st.floats(0, 1e3),
    rule=st.sampled_from(RULES),
)
def test_charge_is_linear_in_units_and_bills_only_what_the_platform_bills(units, seconds, cold, idle, rule):
    cold = min(cold, seconds)
    once = charge(rule, units, seconds, cold, idle)
    assert charge(rule, 2 * units, seconds, cold, idle) == pytest.approx(2 * once)
    expected = seconds - (0 if rule.bill_cold_start else cold) + (idle if rule.bill_keep_alive else 0)
    assert once == pytest.approx(rule.unit_hour / 3600 * units * expected)


def test_keep_warm_compares_the_idle_bill_with_a_cold_start():
    rule = Pricing(1.0)
    # lam = 0.5: a cold start of 4 s is worth 4 billed + 4 s of step time = 8 unit-seconds.
    assert keep_warm(rule, np.array([7.9, 8.1]), 4.0, 0.5).tolist() == [True, False]
    assert keep_warm(Pricing(1.0, bill_keep_alive=False), 1e9, 4.0, 0.5)  # idle is free: keep
    assert keep_warm(rule, 1e9, 4.0, 1.0)  # time only: always keep


def test_price_sheets_name_their_source_and_refuse_an_unknown_gpu():
    assert all(sheet.source for sheet in PRICE_SHEETS.values())
    assert Pricing.from_sheet("modal-2026", "h100").unit_hour == 3.95
    with pytest.raises(ValueError, match="no price for 'tpu'"):
        Pricing.from_sheet("modal-2026", "tpu")


def _prompts(n: int) -> list[PromptSpec]:
    return [PromptSpec(f"p{i}", list(range(i % 5 + 3)), None, "task") for i in range(n)]


def _predictor(n: int) -> LengthPredictor:
    predictor = LengthPredictor()
    for i in range(n):
        predictor.update(f"p{i}", [20 + 7 * (i % 11), 10 + i % 3])
    return predictor


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("policy", ["rlhfless", "verl"])
def test_the_meter_bills_a_plan_run_as_forecast_exactly_what_the_planner_forecast(rule, policy):
    profile = make_profile(step_ms=10.0, per_seq_ms=1.0)
    profile.cold_start_s = 0.3
    config = SchedulerConfig(policy=policy, n_min=3, lam=0.9)
    billing = Billing(rule, resident_units=1.0, warm_actors=1, after_per_token_s=1e-4, next_use_after=True)
    plan = plan_step(_prompts(24), _predictor(24), profile, make_cluster(), config, 2, billing)
    end = plan.predicted_time
    meter = Meter(rule)
    meter.begin_step(0.0)
    meter.open(Invocation("learner", "learner", {}, 1.0, 0.0, 0.0, 0.0))
    for a in plan.actors:
        host = a.gpu_ids[:1] == [0]
        inv = meter.open(
            Invocation(
                f"decode-{a.actor}",
                "decode",
                {},
                float(a.gpus),
                0.0,
                0.0,
                a.cold_start,
                end if policy == "verl" else a.predicted_time,
                colocated_with="learner" if host else None,
                cold=a.cold_start > 0,
            )
        )
        if a.keep_warm and policy != "verl" and not host:
            meter.keep_alive(f"warm-{a.actor}", inv.units, {}, a.predicted_time, end)
    metrics, _ = meter.close_step(end)
    assert metrics["cost/step"] == pytest.approx(plan.predicted_cost, rel=1e-9)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("cold", [0.05, 0.3, 5.0])
def test_gpus_the_learner_hands_over_are_billed_until_it_takes_them_back(rule, cold):
    """`Billing.handoff` (the simulator's learner holds every GPU but for generation): a decode
    function starts on its GPUs with no cold start; once released, its GPUs idle until the
    learner needs them at generation's end where that bills less than a restart (a cold start),
    else restart; the GPUs no actor took do the same over the whole generation."""
    profile = replace(make_profile(step_ms=10.0, per_seq_ms=1.0), cold_start_s=cold)
    cluster = make_cluster()
    billing = Billing(rule, handoff=True, after_units=float(cluster.total_gpus))
    plan = plan_step(
        _prompts(24), _predictor(24), profile, cluster, SchedulerConfig(n_min=2, n_max=5, lam=0.5), 2, billing
    )
    end = plan.predicted_time
    assert all(a.cold_start == 0.0 for a in plan.actors)
    own = 0.0
    for a in plan.actors:
        idle = end - a.predicted_time
        assert a.keep_warm == bool(keep_warm(rule, idle, cold, 0.0))
        back = (
            charge(rule, a.gpus, 0.0, idle_s=idle) if a.keep_warm else charge(rule, a.gpus, cold, cold_s=cold)
        )
        own += charge(rule, a.gpus, a.predicted_time) + back
    untaken = cluster.total_gpus - sum(a.gpus for a in plan.actors)
    assert untaken > 0
    spare = [charge(rule, untaken, 0.0, idle_s=end), charge(rule, untaken, cold, cold_s=cold)]
    assert plan.predicted_cost == pytest.approx(own + (min(spare) if rule.bill_keep_alive else spare[0]))


@pytest.mark.parametrize("rule", ["bill_cold_start=true", "bill_cold_start=false"])
def test_the_meter_bills_a_simulated_step_exactly_what_the_simulator_billed(rule):
    cfg = build(
        {
            "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "l40s", "cold_start_s": 5.0},
            "model": {"name": "qwen2.5-3b"},
            "workload": {"dataset": "gsm8k", "prompts_per_step": 32, "samples": 4, "dataset_size": 64},
            "scheduler": {"bill_cold_start": rule.endswith("true")},
        }
    )
    pricing, cold = cfg.cluster.pricing(cfg.scheduler), cfg.cluster.cold_start_s
    [result] = run_policy(cfg, {"policy": "rlhfless"}, 1)
    end = result.generation
    meter = Meter(pricing)
    meter.begin_step(0.0)

    def hand_back(name, units, released, warm):  # to the learner at `end`: idle, else restarted
        idle = end - released
        if warm:
            meter.keep_alive(f"{name}-warm", units, {}, released, released + min(idle, cold))
        if not warm or idle > cold:  # a restart, timed after the step: only its bill matters here
            meter.open(
                Invocation(
                    f"{name}-restart", "learner", {}, units, end, end, end + cold, end + cold, cold=True
                )
            )

    for i, a in enumerate(result.actors):
        meter.open(Invocation(f"d{i}", "decode", {}, a["gpus"], 0.0, 0.0, a["ready"], a["released"]))
        hand_back(f"d{i}", a["gpus"], a["released"], a["warm"])
    hand_back("untaken", result.untaken_gpus, 0.0, result.untaken_warm)
    metrics, _ = meter.close_step(end + cold)
    assert metrics["cost/step"] == pytest.approx(result.cost_generation, rel=1e-9)


def test_a_budget_takes_the_fastest_plan_that_fits_and_a_deadline_the_cheapest():
    profile, cluster = make_profile(step_ms=10.0, per_seq_ms=1.0), make_cluster()
    free = plan_step(_prompts(24), _predictor(24), profile, cluster, SchedulerConfig(), 2)
    rows = free.candidates
    fastest, cheapest = min(rows, key=lambda r: r["time"]), min(rows, key=lambda r: r["cost"])
    assert fastest["n"] != cheapest["n"]
    budget = (fastest["cost"] + cheapest["cost"]) / 2
    within = plan_step(
        _prompts(24), _predictor(24), profile, cluster, SchedulerConfig(budget_per_step=budget), 2
    )
    fits = [r for r in rows if r["cost"] <= budget]
    assert within.n_actors == min(fits, key=lambda r: r["time"])["n"] and within.predicted_cost <= budget
    deadline = (fastest["time"] + cheapest["time"]) / 2
    timed = plan_step(
        _prompts(24), _predictor(24), profile, cluster, SchedulerConfig(deadline_per_step=deadline), 2
    )
    fits = [r for r in rows if r["time"] <= deadline]
    assert timed.n_actors == min(fits, key=lambda r: r["cost"])["n"] and timed.predicted_time <= deadline


def test_an_infeasible_budget_or_deadline_is_one_line_naming_the_best_plan_there_is():
    profile, cluster = make_profile(step_ms=10.0, per_seq_ms=1.0), make_cluster()
    with pytest.raises(PlanError, match=r"budget_per_step: got 1e-09 \$, expected at least the cheapest"):
        plan_step(_prompts(8), _predictor(8), profile, cluster, SchedulerConfig(budget_per_step=1e-9), 2)
    with pytest.raises(PlanError, match=r"deadline_per_step: got 1e-06 s, expected at least the fastest"):
        plan_step(_prompts(8), _predictor(8), profile, cluster, SchedulerConfig(deadline_per_step=1e-6), 2)
    with pytest.raises(ValueError, match="one target at a time"):
        SchedulerConfig(budget_per_step=1.0, deadline_per_step=1.0)


def test_a_budget_keeps_the_margin_its_forecast_has_lately_fallen_short_by():
    from rlhfless.planner.forecast import Margins
    from rlhfless.planner.scaling import CandidateTable

    n = np.array([1, 2, 3])
    table = CandidateTable(
        n, np.array([30.0, 20.0, 10.0]), np.array([1.0, 1.5, 2.0]), n * 0.0, n > 0, n > 0, n * 0.0
    )
    assert table.n[choose(table, budget=1.6)] == 2
    margins = Margins()
    assert margins.margin("cost") == pytest.approx(0.5)  # nothing seen: the forecast range's high end
    for forecast, actual in ((1.0, 5.0), (1.0, 1.2), (1.0, 1.2)):  # the first step is left out
        margins.observe({"time": 10.0, "cost": forecast}, {"time": 10.0, "cost": actual})
    assert margins.margin("cost") == pytest.approx(0.2 + 0.5 / 3)  # the prior shrinks with each step seen
    margins = Margins(prior=0.0)
    for forecast, actual in ((1.0, 5.0), (1.0, 1.2), (1.0, 1.2)):
        margins.observe({"time": 10.0, "cost": forecast}, {"time": 10.0, "cost": actual})
    assert margins.margin("cost") == pytest.approx(0.2)
    assert table.n[choose(table, budget=1.6, margins=(0.0, 0.2))] == 1  # 1.5 x 1.2 > 1.6
    assert table.n[choose(table, budget=1.1, margins=(0.0, 0.2))] == 1  # only the bare forecast fits
    with pytest.raises(PlanError, match="cheapest plan's forecast 1 \\$ \\(N=1\\)"):
        choose(table, budget=0.5)


@pytest.mark.parametrize(
    ("key", "target", "forecast"),
    [("budget_per_step", 1e-9, "predicted_step_cost"), ("deadline_per_step", 1e-6, "predicted_step_time")],
)
def test_a_step_no_plan_fits_takes_the_nearest_plan_and_says_so_when_asked(key, target, forecast):
    profile, cluster = make_profile(step_ms=10.0, per_seq_ms=1.0), make_cluster()

    def plan(**kw):
        return plan_step(_prompts(8), _predictor(8), profile, cluster, SchedulerConfig(**kw), 2)

    with pytest.raises(PlanError) as refused:
        plan(**{key: target})
    nearest = plan(**{key: target}, target_miss="nearest")
    assert nearest.target == {key: target, "missed": 1.0}
    assert nearest.missed_target() == str(refused.value)  # the line the default stops with
    assert getattr(nearest, forecast) == pytest.approx(refused.value.least)
    # It is the plan whose target is that forecast: the nearest there is, met exactly.
    met = plan(**{key: refused.value.least})
    assert met.n_actors == nearest.n_actors and met.target == {key: refused.value.least, "missed": 0.0}
    assert met.missed_target() is None
    with pytest.raises(ValueError, match="target_miss: got 'warn', expected one of stop, nearest"):
        SchedulerConfig(target_miss="warn")


def test_the_learners_wait_for_its_ranks_at_each_n_is_in_the_step_forecast_and_the_lam_score():
    profile, cluster = make_profile(step_ms=10.0, per_seq_ms=1.0), make_cluster()
    rows = plan_step(_prompts(24), _predictor(24), profile, cluster, SchedulerConfig(), 2).candidates
    fastest = min(rows, key=lambda r: r["time"])
    slower = min((r for r in rows if r["n"] < fastest["n"]), key=lambda r: r["time"])
    gap = slower["time"] - fastest["time"]
    # From the fastest N on, the ranks wait 5 s past that gap: a smaller N ends the step first.
    waits = tuple(0.0 if n < fastest["n"] else gap + 5.0 for n in range(1, fastest["n"] + 1))
    pricing = SchedulerConfig().pricing
    deadline = SchedulerConfig(deadline_per_step=1e-6, target_miss="nearest")  # the fastest step
    by_time = plan_step(_prompts(24), _predictor(24), profile, cluster, deadline, 2, Billing(pricing))
    assert by_time.n_actors == fastest["n"] and by_time.predicted_step_time == pytest.approx(fastest["time"])
    billing = Billing(pricing, learner_wait_s=waits)
    waited = plan_step(_prompts(24), _predictor(24), profile, cluster, deadline, 2, billing)
    assert waited.n_actors == slower["n"] and waited.predicted_step_time == pytest.approx(slower["time"])
    # lam weighs it too: all on time, it takes the N that ends the step first.
    by_lam = SchedulerConfig(lam=1.0, max_slowdown=None)
    assert plan_step(_prompts(24), _predictor(24), profile, cluster, by_lam, 2).n_actors == fastest["n"]
    assert (
        plan_step(_prompts(24), _predictor(24), profile, cluster, by_lam, 2, billing).n_actors == slower["n"]
    )
    # N past the waits' table waits as the last of it; each wait is billed on the learner's units.
    seconds, cost = Billing(pricing, after_units=2.0, learner_wait_s=waits).after_generation(
        0.0, np.array([1, fastest["n"], fastest["n"] + 3])
    )
    assert seconds.tolist() == [0.0, gap + 5.0, gap + 5.0]
    assert cost.tolist() == pytest.approx(charge(pricing, 2.0, seconds).tolist())


def test_an_extra_ranks_start_is_billed_on_its_slot_whether_or_not_the_phase_waits_for_it():
    # Two slots learning, one of them the learner's: the extra rank starts in 8 s. At N = 1 the
    # phase waits 1 s for it (it started during generation, 7 s of it billed before the phase);
    # at N = 2 it waits the whole start (billed on both slots, as any wait).
    pricing = SchedulerConfig().pricing
    billing = Billing(
        pricing, resident_units=1.0, after_units=2.0, learner_wait_s=(1.0, 8.0), rank_start_s=8.0
    )
    seconds, cost = billing.after_generation(0.0, np.array([1, 2]))
    assert seconds.tolist() == [1.0, 8.0]
    assert cost.tolist() == pytest.approx(
        [charge(pricing, 2.0, 1.0) + charge(pricing, 1.0, 7.0), charge(pricing, 2.0, 8.0)]
    )
    # Ranks that live across steps (verl's) start no more: nothing before the phase.
    resident = replace(billing, rank_start_s=0.0)
    assert resident.after_generation(0.0, np.array([1]))[1].tolist() == pytest.approx(
        [charge(pricing, 2.0, 1.0)]
    )


@pytest.mark.parametrize("n", [1, 3])
def test_a_step_waits_what_is_left_of_the_learners_decode_function_start_on_the_learners_slot(n):
    # The decode function on the learner's resources (slot 0) was started before the run's first
    # step; that step waits the rest of its start, billed as the learner's slot held longer.
    profile, pricing = make_profile(step_ms=10.0, per_seq_ms=1.0), Pricing(3600.0)
    profile.cold_start_s = 0.3
    config = SchedulerConfig(n_min=n, n_max=n)
    started = Billing(pricing, resident_units=1.0, warm_actors=n)
    plans = [
        plan_step(_prompts(24), _predictor(24), profile, make_cluster(), config, 2, billing)
        for billing in (started, replace(started, host_start_s=5.0))
    ]
    hosts = [next(a for a in p.actors if a.node == 0 and a.gpu_ids[:1] == [0]) for p in plans]
    assert [h.cold_start for h in hosts] == [0.0, 5.0]
    assert [a.cold_start for a in plans[1].actors if a is not hosts[1]] == [0.0] * (n - 1)  # warm
    assert hosts[1].predicted_time == pytest.approx(hosts[0].predicted_time + 5.0)
    assert plans[1].predicted_time == pytest.approx(max(a.predicted_time for a in plans[1].actors))
    assert plans[1].predicted_cost >= plans[0].predicted_cost
    if n == 1:  # the learner's slot, 5 s longer: $1 a second at this price
        assert plans[1].predicted_cost - plans[0].predicted_cost == pytest.approx(5.0)


def _widths(one_rank_s: float, speedup: float, start_s: float) -> tuple[LearningWidth, ...]:
    """One rank learning at `one_rank_s` a token, or two at `speedup` x its speed, the extra rank
    starting in `start_s` (waited for only where N holds its slot, as on two slots)."""
    return (
        LearningWidth(1, 1.0, one_rank_s, (0.0,), 0.0),
        LearningWidth(2, 2.0, one_rank_s / speedup, (0.5, start_s), start_s),
    )


@settings(max_examples=25, deadline=None)
@given(
    one_rank_s=st.floats(1e-3, 0.1),
    speedup=st.floats(1.0, 2.0),
    start_s=st.floats(0.0, 10.0),
    where=st.floats(0.0, 1.0),
    by_budget=st.booleans(),
)
def test_a_budget_or_deadline_takes_the_fastest_or_cheapest_pair_of_n_and_learning_width(
    one_rank_s, speedup, start_s, where, by_budget
):
    profile, cluster = make_profile(step_ms=10.0, per_seq_ms=1.0), make_cluster(nodes=1, gpus_per_node=2)
    pricing = SchedulerConfig().pricing
    billing = Billing(
        pricing,
        resident_units=1.0,
        after_units=2.0,
        after_per_token_s=one_rank_s / speedup,
        widths=_widths(one_rank_s, speedup, start_s),
    )

    def plan(**target):
        return plan_step(_prompts(8), _predictor(8), profile, cluster, SchedulerConfig(**target), 2, billing)

    lam = plan()
    assert lam.learner_width == 0  # without a target the phase chooses its own width
    options = lam.step_options
    assert {(o["n"], o["width"]) for o in options} == {(r["n"], w) for r in lam.candidates for w in (1, 2)}
    key, bound, other = (
        ("budget_per_step", "step_cost", "step_time")
        if by_budget
        else ("deadline_per_step", "step_time", "step_cost")
    )
    low, high = min(o[bound] for o in options), max(o[bound] for o in options)
    target = low + where * (high - low)
    chosen = plan(**{key: target})
    fits = [o for o in options if o[bound] <= target * (1 + 1e-9)]
    best = min(fits, key=lambda o: (o[other], o[bound]))
    forecast = chosen.predicted_step_cost if by_budget else chosen.predicted_step_time
    assert forecast <= target * (1 + 1e-9)
    picked = next(o for o in options if (o["n"], o["width"]) == (chosen.n_actors, chosen.learner_width))
    assert (picked["step_time"], picked["step_cost"]) == pytest.approx((best["step_time"], best["step_cost"]))
    assert picked["step_time"] == pytest.approx(chosen.predicted_step_time)
    assert picked["step_cost"] == pytest.approx(chosen.predicted_step_cost)


def test_one_rank_learning_slower_and_cheaper_is_what_a_budget_between_the_widths_buys():
    # Two ranks learn 1.4x as fast as one (two CPU cores): twice the slots for 0.71x the time.
    profile, cluster = make_profile(step_ms=10.0, per_seq_ms=1.0), make_cluster(nodes=1, gpus_per_node=2)
    billing = Billing(
        SchedulerConfig().pricing, resident_units=1.0, after_units=2.0, widths=_widths(0.05, 1.4, 4.0)
    )
    options = plan_step(
        _prompts(8), _predictor(8), profile, cluster, SchedulerConfig(), 2, billing
    ).step_options
    at_one = [o for o in options if o["n"] == 1]
    one, two = sorted(at_one, key=lambda o: o["width"])
    assert one["step_cost"] < two["step_cost"] and one["step_time"] > two["step_time"]
    budget = (one["step_cost"] + two["step_cost"]) / 2
    cheap = plan_step(
        _prompts(8), _predictor(8), profile, cluster, SchedulerConfig(budget_per_step=budget), 2, billing
    )
    assert cheap.learner_width == 1 and cheap.predicted_step_cost <= budget
    fast = plan_step(
        _prompts(8),
        _predictor(8),
        profile,
        cluster,
        SchedulerConfig(deadline_per_step=two["step_time"]),
        2,
        billing,
    )
    assert fast.learner_width == 2 and fast.predicted_step_time == pytest.approx(two["step_time"])
