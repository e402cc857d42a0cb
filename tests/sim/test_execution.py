"""Event-based continuous batching must equal stepping the engine token by token."""

from dataclasses import replace

import numpy as np
import pytest

from rlhfless.planner.hardware import roofline_profile
from rlhfless.sim.execution import schedule, slot_cap

PROFILE = roofline_profile("llama-2-7b", "h100", 1)


def token_by_token(context, remaining, cap, ready=None):
    """Reference engine: FCFS admission into `cap` slots once a sequence is ready (engine step),
    one token per running sequence per step; an idle engine ticks at its one-sequence step time."""
    ready = np.zeros(len(remaining)) if ready is None else ready
    waiting, running = list(range(len(remaining))), []
    generated = np.zeros(len(remaining))
    t, step, finish = 0.0, 0, np.zeros(len(remaining))
    while waiting or running:
        while len(running) < cap and waiting and ready[waiting[0]] <= step:
            running.append(waiting.pop(0))
        step += 1
        if not running:
            t += float(PROFILE.decode_step_seconds(1, 0.0))
            continue
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


def test_late_arrivals_join_at_their_ready_step_while_the_others_keep_running():
    remaining = np.array([50.0, 80.0, 30.0, 40.0])
    context = np.array([100.0, 200.0, 300.0, 400.0])
    ready = np.array([0.0, 0.0, 20.0, 120.0])  # the last one arrives after the others finished
    plan = schedule(PROFILE, 0.0, np.arange(4), context, remaining, 8, ready)
    assert plan.start.tolist() == [0, 0, 20, 120]
    np.testing.assert_allclose(plan.finish, token_by_token(context, remaining, 8, ready), rtol=1e-5)


def test_progress_queries_follow_the_schedule():
    remaining = np.array([10.0, 100.0, 1000.0])
    plan = schedule(PROFILE, 5.0, np.arange(3), np.full(3, 50.0), remaining, cap=8)
    t = float(plan.finish[1])
    assert plan.generated_at(t).tolist() == pytest.approx([10, 100, 100])
    assert plan.active_at(t) == 1 and plan.end_time == pytest.approx(plan.finish[2])
    assert plan.grid_time[0] == 5.0


def test_slot_cap_counts_final_lengths_against_kv_capacity_and_the_engine_batch_limit():
    context, remaining = np.full(4, 1000.0), np.full(4, 1000.0)
    assert slot_cap(PROFILE, context, remaining) == PROFILE.max_kv_tokens // 2000
    limited = replace(PROFILE, max_batch=16)
    assert slot_cap(limited, context, remaining) == 16
    assert slot_cap(limited, np.full(4, 20000.0), remaining) == PROFILE.max_kv_tokens // 21000 < 16
