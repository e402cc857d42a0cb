"""Event-based continuous batching must equal stepping the engine token by token."""

import numpy as np
import pytest

from rlhfless.planner.hardware import roofline_profile
from rlhfless.sim.execution import prefill_seconds, schedule, slot_cap

PROFILE = roofline_profile("llama-2-7b", "h100", 1)


def token_by_token(context, remaining, cap):
    """Reference engine: FCFS admission into `cap` slots, one token per running sequence per step."""
    waiting, running = list(range(len(remaining))), []
    generated = np.zeros(len(remaining))
    t, finish = 0.0, np.zeros(len(remaining))
    while waiting or running:
        while len(running) < cap and waiting:
            running.append(waiting.pop(0))
        mean_context = np.mean([context[j] + generated[j] for j in running]) + 0.5
        t += float(PROFILE.decode_step_seconds(len(running), mean_context))
        for j in list(running):
            generated[j] += 1
            if generated[j] >= remaining[j]:
                running.remove(j)
                finish[j] = t
    return finish


@pytest.mark.parametrize("cap", [100, 7, 1])
def test_schedule_matches_the_token_by_token_engine(cap):
    rng = np.random.default_rng(cap)
    remaining = rng.integers(1, 200, 30).astype(float)
    context = rng.integers(10, 500, 30).astype(float)
    plan = schedule(PROFILE, 0.0, np.arange(30), context, remaining, cap)
    np.testing.assert_allclose(plan.finish, token_by_token(context, remaining, cap), rtol=1e-5)


def test_progress_queries_follow_the_schedule():
    remaining = np.array([10.0, 100.0, 1000.0])
    plan = schedule(PROFILE, 5.0, np.arange(3), np.full(3, 50.0), remaining, cap=8)
    t = float(plan.finish[1])
    assert plan.generated_at(t).tolist() == pytest.approx([10, 100, 100])
    assert plan.active_at(t) == 1 and plan.end_time == pytest.approx(plan.finish[2])
    assert plan.grid_time[0] == 5.0


def test_slot_cap_counts_final_lengths_against_kv_capacity():
    context, remaining = np.full(4, 1000.0), np.full(4, 1000.0)
    assert slot_cap(PROFILE, context, remaining) == PROFILE.max_kv_tokens // 2000


def test_prefill_in_chunks_costs_more_than_one_chunk_and_nothing_for_nothing():
    assert prefill_seconds(PROFILE, 0) == 0.0
    assert prefill_seconds(PROFILE, 4096) == pytest.approx(2 * prefill_seconds(PROFILE, 2048))
