"""Event-based continuous batching must equal stepping the engine token by token."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.planner import admission
from rlhfless.planner.hardware import roofline_profile
from rlhfless.sim.execution import Siblings, schedule, slot_cap

PROFILE = roofline_profile("llama-2-7b", "h100", 1)


def advance(running, context, generated, remaining, t):
    """One engine step: each running sequence decodes a token, at the step time of the batch and
    its mean context. Returns the time after it and the sequences it finished (no longer running)."""
    mean_context = np.mean([context[j] + generated[j] for j in running]) + 0.5
    t += float(PROFILE.decode_step_seconds(len(running), mean_context))
    finished = []
    for j in list(running):
        generated[j] += 1
        if generated[j] >= remaining[j]:
            running.remove(j)
            finished.append(j)
    return t, finished


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
        t, ended = advance(running, context, generated, remaining, t)
        finish[ended] = t
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


def adaptive_by_token(context, remaining, cap, group, predicted):
    """Reference engine for sibling admission: each free slot, at each step, takes the queued
    sequence whose prompt's samples say it is longest (`admission.estimates`, ties: queue order)."""
    n = len(remaining)
    waiting, running = list(range(n)), []
    generated, start = np.zeros(n), np.full(n, -1.0)
    done = np.zeros(n, dtype=bool)
    t, step, finish = 0.0, 0, np.zeros(n)
    while waiting or running:
        while len(running) < cap and waiting:
            if step == 0:
                pick = waiting[0]
            else:
                est = []
                for j in waiting:
                    mine = [k for k in range(n) if group[k] == group[j] and k != j]
                    fin = [remaining[k] for k in mine if done[k]]
                    began = [start[k] for k in mine if start[k] >= 0]
                    running_for = step - min(began) if began else 0.0
                    est.append(
                        admission.estimates(
                            np.array([predicted[j]]),
                            np.array([float(sum(fin))]),
                            np.array([float(len(fin))]),
                            np.array([running_for]),
                        )[0]
                    )
                pick = waiting[int(np.argmax(est))]
            waiting.remove(pick)
            running.append(pick)
            start[pick] = step
        step += 1
        t, ended = advance(running, context, generated, remaining, t)
        done[ended], finish[ended] = True, t
    return start, finish


@pytest.mark.parametrize("cap", [3, 8])
def test_sibling_admission_matches_its_token_by_token_engine(cap):
    rng = np.random.default_rng(cap)
    group = np.repeat(np.arange(6), 4)
    remaining = np.maximum(1, np.repeat(rng.integers(5, 120, 6), 4) + rng.integers(-4, 5, 24)).astype(float)
    context = rng.integers(10, 300, 24).astype(float)
    predicted = np.full(24, 60.0)
    order = admission.initial_order(predicted, group, True)
    group, remaining, context = group[order], remaining[order], context[order]
    sib = Siblings(group, predicted, np.zeros(24))
    plan = schedule(PROFILE, 0.0, np.arange(24), context, remaining, cap, siblings=sib)
    start, finish = adaptive_by_token(context, remaining, cap, group, predicted)
    np.testing.assert_array_equal(plan.start, start)
    np.testing.assert_allclose(plan.finish, finish, rtol=1e-5)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 7), st.integers(1, 60)), min_size=1, max_size=40), st.integers(1, 12)
)
def test_sibling_admission_starts_every_sequence_once_and_never_runs_more_than_the_cap(rows, cap):
    group = np.array([g for g, _ in rows])
    remaining = np.array([float(r) for _, r in rows])
    sib = Siblings(group, np.full(len(rows), 30.0), np.zeros(len(rows)))
    plan = schedule(
        PROFILE, 0.0, np.arange(len(rows)), np.full(len(rows), 50.0), remaining, cap, siblings=sib
    )
    assert np.all(np.isfinite(plan.start)) and np.all(plan.start >= 0)
    assert np.count_nonzero(plan.start == 0) == min(cap, len(rows))
    for s in np.unique(plan.start):
        assert np.count_nonzero((plan.start <= s) & (plan.end > s)) <= cap
    np.testing.assert_allclose(plan.end - plan.start, remaining)
