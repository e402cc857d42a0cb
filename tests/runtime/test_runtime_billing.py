"""The meter prices resource-seconds, bills colocated functions once, and its parts add up."""

import pytest

from rlhfless.runtime.billing import Invocation, Meter
from rlhfless.runtime.pool import FunctionPool
from rlhfless.runtime_config import FaultSpec, RuntimeConfig

PRICE = 3600.0  # $1 per unit-second keeps the arithmetic readable


def step_meter() -> tuple[Meter, dict]:
    meter = Meter(PRICE)
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


def test_phase_costs_tile_the_step():
    metrics, _ = step_meter()
    assert (metrics["cost/generation"], metrics["cost/preparation"], metrics["cost/learning"]) == (
        9.0,
        1.0,
        4.0,
    )


def test_cold_start_idle_and_timeline_times_are_relative_to_the_step():
    metrics, out = step_meter()
    remote = next(r for r in out["records"] if r["name"] == "decode-1")
    assert (remote["requested"], remote["started"], remote["ready"], remote["released"]) == (0, 1, 2.5, 3)
    assert remote["busy"] == [[2.5, 3.0]]
    assert metrics["actors/cold_starts"] == 1 and metrics["time/cold_start"] == 1.5
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


def test_pool_reuses_a_warm_function_of_the_same_shape_until_its_keep_alive_ends():
    created, stopped = [], []
    pool = FunctionPool(lambda shape: created.append(shape) or FakeHandle(), 10.0, stop=stopped.append)
    first = pool.acquire(("decode", False, 0), now=0.0)
    pool.release(first, now=1.0)
    assert pool.acquire(("decode", True, 0), now=2.0).cold  # another shape: a cold start
    again = pool.acquire(("decode", False, 0), now=5.0)
    assert again is first and not again.cold
    pool.release(again, now=6.0)
    assert pool.acquire(("decode", False, 0), now=20.0) is not first  # expired and stopped
    assert len(created) == 3 and stopped == [first.handle]


def test_fault_injection_spec_parses_and_rejects_garbage():
    assert RuntimeConfig(fault_injection="actor=1,step=2,after=30").fault == FaultSpec(1, 2, 30)
    assert RuntimeConfig().fault is None
    with pytest.raises(ValueError, match="fault_injection"):
        RuntimeConfig(fault_injection="kill it")
