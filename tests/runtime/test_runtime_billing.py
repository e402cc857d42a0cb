"""The meter prices resource-seconds, bills colocated functions once, and its parts add up."""

import pytest

from rlhfless.planner.pricing import Pricing
from rlhfless.runtime.billing import Invocation, Meter
from rlhfless.runtime.pool import FunctionPool

PRICE = Pricing(3600.0)  # $1 per unit-second keeps the arithmetic readable


def step_meter(pricing: Pricing = PRICE) -> tuple[Meter, dict]:
    meter = Meter(pricing)
    meter.begin_step(100.0)
    learner = meter.open(Invocation("learner", "learner", {"CPU": 1}, 1.0, 100.0, 100.0, 100.0))
    colocated = meter.open(
        Invocation("decode-0", "decode", {"CPU": 1}, 1.0, 100.0, 100.0, colocated_with="learner")
    )
    colocated.released = 104.0
    remote = meter.open(Invocation("decode-1", "decode", {"CPU": 2}, 2.0, 100.0, cold=True))
    remote.started, remote.ready, remote.released = 101.0, 102.5, 103.0
    remote.mark_busy(102.5, 103.0)
    never = meter.open(Invocation("decode-2", "decode", {"CPU": 1}, 1.0, 100.0))  # never got resources
    meter.phase("preparation", 105.0)
    meter.phase("learning", 106.0)
    learner.mark_busy(106.0, 110.0)
    metrics, records = meter.close_step(110.0)
    return metrics, {"records": records, "never": never}


def test_step_cost_is_units_times_alive_seconds_with_colocated_functions_billed_once():
    metrics, out = step_meter()
    cost = {r["name"]: r["cost"] for r in out["records"]}
    assert cost == {"learner": 10.0, "decode-0": 0.0, "decode-1": 4.0, "decode-2": 0.0}
    assert metrics["cost/step"] == sum(cost.values()) == 14.0


def test_a_steps_longest_cold_start_so_far_stands_in_for_a_rank_start_not_yet_measured():
    """A fresh machine's measured profile has no cold start, so a run's first phase had no rank
    start to request its ranks by: they started at generation's end, and learning waited 5-6 s."""
    meter = Meter(PRICE)
    meter.begin_step(100.0)
    assert meter.cold_start_s() is None
    warm = meter.open(Invocation("decode-0", "decode", {"CPU": 1}, 1.0, 100.0, 100.0, 100.0))
    starting = meter.open(Invocation("decode-1", "decode", {"CPU": 1}, 1.0, 100.5, 100.5, cold=True))
    assert meter.cold_start_s() is None  # neither a cold start nor one over yet
    starting.ready = 106.0
    slow = meter.open(Invocation("decode-2", "decode", {"CPU": 1}, 1.0, 101.0, 101.0, 104.0, cold=True))
    assert meter.cold_start_s() == 5.5 and warm.cold is False and slow.ready == 104.0


def test_an_unbilled_cold_start_is_left_out_of_the_bill():
    _, out = step_meter(Pricing(3600.0, bill_cold_start=False))
    cost = {r["name"]: r["cost"] for r in out["records"]}
    assert cost["decode-1"] == 2.0 * (3.0 - 2.5)  # ready at 102.5, released at 103


def test_a_warm_function_idle_in_the_pool_is_billed_for_its_part_inside_the_step():
    meter = Meter(PRICE)
    meter.begin_step(100.0)
    meter.keep_alive("warm-decode-3", 2.0, {"CPU": 2}, 90.0, 104.0)  # idle since the last step
    meter.keep_alive("warm-decode-4", 1.0, {"CPU": 1}, 108.0, 130.0)  # still idle at the end
    meter.keep_alive("warm-prepare-5", 0.0, {}, 100.0, 110.0)  # on the learner's resources: none
    metrics, records = meter.close_step(110.0)
    assert {r["name"]: r["cost"] for r in records} == {"warm-decode-3": 8.0, "warm-decode-4": 2.0}
    assert metrics["cost/keep_alive"] == metrics["cost/step"] == 10.0
    assert metrics["time/keep_alive"] == 10.0
    unbilled, _ = Meter(Pricing(3600.0, bill_keep_alive=False)), None
    unbilled.begin_step(100.0)
    unbilled.keep_alive("warm-decode-3", 2.0, {"CPU": 2}, 90.0, 104.0)
    assert unbilled.close_step(110.0)[0]["cost/step"] == 0.0


def test_phase_costs_tile_the_step():
    metrics, _ = step_meter()
    assert (metrics["cost/generation"], metrics["cost/preparation"], metrics["cost/learning"]) == (
        9.0,
        1.0,
        4.0,
    )


def test_a_learner_rank_started_during_generation_is_all_the_learning_phase_s_cost():
    meter = Meter(PRICE)
    meter.begin_step(100.0)
    rank = meter.open(Invocation("learner-1", "learner", {"CPU": 1}, 1.0, 103.0, cold=True, phase="learning"))
    rank.started, rank.ready = 103.0, 105.0  # requested before generation ends, at 106
    meter.phase("learning", 106.0)
    metrics, _ = meter.close_step(110.0)
    assert (metrics["cost/generation"], metrics["cost/learning"], metrics["cost/step"]) == (0.0, 7.0, 7.0)


def test_cold_start_idle_and_timeline_times_are_relative_to_the_step():
    metrics, out = step_meter()
    remote = next(r for r in out["records"] if r["name"] == "decode-1")
    assert (remote["requested"], remote["started"], remote["ready"], remote["released"]) == (0, 1, 2.5, 3)
    assert remote["busy"] == [[2.5, 3.0]]
    assert metrics["actors/cold_starts"] == 1 and metrics["time/cold_start"] == 1.5
    assert metrics["time/decode_cold_start"] == 1.5  # the longest decode start: what generation waited
    assert metrics["time/idle"] == pytest.approx((10 - 4) + (2 - 0.5))


def test_busy_intervals_that_touch_merge():
    inv = Invocation("d", "decode", {}, 1.0, 0.0)
    inv.mark_busy(0.0, 1.0)
    inv.mark_busy(1.0, 2.0)
    inv.mark_busy(3.0, 4.0)
    assert inv.busy == [[0.0, 2.0], [3.0, 4.0]]


class FakeHandle:
    class hello:
        @staticmethod
        def remote():
            return None

    where = hello


def test_pool_reuses_a_warm_function_of_the_same_shape_until_its_keep_alive_ends():
    created, stopped = [], []
    pool = FunctionPool(lambda shape, after: created.append(shape) or FakeHandle(), 10.0, stop=stopped.append)
    first = pool.acquire(("decode", False, 0), now=0.0)
    pool.release(first, now=1.0)
    assert pool.acquire(("decode", True, 0), now=2.0).cold  # another shape: a cold start
    again = pool.acquire(("decode", False, 0), now=5.0)
    assert again is first and not again.cold
    pool.release(again, now=6.0)
    assert pool.acquire(("decode", False, 0), now=20.0) is not first  # expired and stopped
    assert len(created) == 3 and stopped == [first.handle]


def test_pool_records_every_idle_span_for_the_meter_and_stops_what_it_is_told_to():
    stopped = []
    pool = FunctionPool(lambda shape, after: FakeHandle(), 10.0, stop=stopped.append)
    a, b = pool.acquire(("decode", False, 0), now=0.0), pool.acquire(("decode", False, 1), now=0.0)
    pool.release(a, now=1.0)
    pool.release(b, now=2.0, keep=False)  # stopped at release: no idle span
    assert stopped == [b.handle]
    assert pool.acquire(("decode", False, 0), now=4.0) is a
    pool.release(a, now=5.0)
    spans = [(s.lease, s.start, s.end) for s in pool.take_spans(now=7.0)]
    assert spans == [(a, 1.0, 4.0), (a, 5.0, 7.0)]  # the ended span once, the open one so far
    pool.evict(now=20.0)  # the keep-alive ran out at 15
    assert [(s.start, s.end) for s in pool.take_spans(now=20.0)] == [(5.0, 15.0)]
