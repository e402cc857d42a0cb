"""Cut-and-migrate decisions: who is cut, where stragglers go, and the global-cut baseline."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.migration import (
    ActorProgress,
    decide,
    decide_global_cut,
    decide_migrations,
    remaining_tokens,
)
from tests.planner.planner_support import make_profile


@st.composite
def progress_lists(draw):
    actors = []
    for i in range(draw(st.integers(1, 6))):
        total = draw(st.integers(1, 12))
        finished = draw(st.integers(0, total))
        remaining = {f"a{i}s{j}": float(draw(st.integers(1, 500))) for j in range(total - finished)}
        actors.append(
            ActorProgress(i, finished, total, draw(st.integers(0, 4)), draw(st.booleans()), remaining)
        )
    return actors


def check_targets(progress, moves, cut_ids=None):
    by_id = {p.actor: p for p in progress}
    received: dict[int, int] = {}
    for m in moves:
        target = by_id[m.target]
        assert target.running and target.free_slots > 0 and m.target != m.source
        assert m.sequence in by_id[m.source].remaining
        if cut_ids is not None:
            assert m.target not in cut_ids and m.source in cut_ids
        received[m.target] = received.get(m.target, 0) + 1
    assert all(n <= by_id[a].free_slots for a, n in received.items())
    assert len({m.sequence for m in moves}) == len(moves)


@settings(max_examples=80, deadline=None)
@given(progress_lists(), st.floats(0.1, 1.0))
def test_migrations_only_target_running_actors_with_free_slots(progress, tau):
    config = SchedulerConfig(tau=tau)
    moves = decide_migrations(progress, config)
    cut = {p.actor for p in progress if p.running and p.remaining and p.finished >= tau * p.total}
    check_targets(progress, moves, cut)
    check_targets(progress, decide_global_cut(progress, config))


def test_longest_straggler_goes_to_the_least_loaded_actor_and_the_rest_stay():
    progress = [
        ActorProgress(0, 8, 10, 0, True, {"x": 50.0, "y": 400.0}),
        ActorProgress(1, 2, 10, 1, True, {f"b{i}": 100.0 for i in range(8)}),
        ActorProgress(2, 5, 10, 1, True, {f"c{i}": 10.0 for i in range(5)}),
        ActorProgress(3, 0, 0, 9, False, {}),
    ]
    moves = decide_migrations(progress, SchedulerConfig(tau=0.7))
    assert [(m.sequence, m.source, m.target) for m in moves] == [("y", 0, 2), ("x", 0, 1)]


def test_no_cut_below_tau_and_none_for_verl():
    progress = [ActorProgress(0, 6, 10, 0, True, {"x": 1.0}), ActorProgress(1, 0, 10, 5, True, {"y": 1.0})]
    assert decide_migrations(progress, SchedulerConfig(tau=0.7)) == []
    assert decide(progress, SchedulerConfig(policy="verl", tau=0.5)) == []


def test_global_cut_gathers_stragglers_on_the_fewest_actors_once():
    progress = [
        ActorProgress(0, 9, 10, 3, True, {"a": 5.0}),
        ActorProgress(1, 9, 10, 1, True, {"b": 5.0}),
        ActorProgress(2, 8, 10, 0, True, {"c": 5.0, "d": 9.0}),
    ]
    config = SchedulerConfig(policy="rlhfuse", tau=0.8)
    moves = decide(progress, config)
    assert {(m.sequence, m.target) for m in moves} == {("b", 0), ("c", 0), ("d", 0)}
    after = [
        ActorProgress(0, 9, 13, 0, True, {"a": 5.0, "b": 5.0, "c": 5.0, "d": 9.0}),
        ActorProgress(1, 9, 9, 0, False, {}),
        ActorProgress(2, 8, 8, 0, False, {}),
    ]
    assert decide(after, config) == []


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4096), st.integers(0, 4096), st.one_of(st.none(), st.integers(1, 4096)))
def test_a_sequence_has_its_predicted_rest_left_or_once_it_outlived_that_the_rest_up_to_the_cap(
    predicted, generated, cap
):
    left = remaining_tokens(predicted, generated, cap)
    assert left >= 1.0
    if generated < predicted:
        assert left == predicted - generated
    elif cap is not None:
        assert left == max(1.0, cap - generated)
    else:
        assert left == 1.0


def test_remaining_tokens_broadcasts_as_the_simulator_calls_it():
    left = remaining_tokens(np.array([100.0, 100.0, 100.0]), np.array([40.0, 100.0, 150.0]), 160)
    assert left.tolist() == [60.0, 60.0, 10.0]


def test_an_outlived_sequence_runs_on_as_far_as_last_steps_overrunning_samples_did():
    # Last step's samples ran to 0.5x, 1.2x, 1.5x and 3x their group's planned max. A sequence
    # predicted 100 that has generated 130 is past 0.5x and 1.2x: it ends at the mean of 150 and
    # 300 (the 300 capped at 200). One past every ratio still runs to the cap.
    overrun = [0.5, 1.2, 1.5, 3.0]
    assert remaining_tokens(100.0, 130.0, 200, overrun) == (150 + 200) / 2 - 130
    assert remaining_tokens(100.0, 310.0, 400, overrun) == 400 - 310
    assert remaining_tokens(100.0, 40.0, 200, overrun) == 60.0  # not outlived: as predicted
    left = remaining_tokens(np.array([100.0, 100.0]), np.array([130.0, 40.0]), 200, overrun)
    assert left.tolist() == [45.0, 60.0]


def _cost_case(lam, slots=0):
    """A cut actor whose ten equal stragglers end the step; each move shortens it a little (one
    less sequence a step) while its receiver, until now near done, decodes 100 steps more."""
    profile = make_profile(step_ms=10, per_seq_ms=1)
    source = ActorProgress(0, 90, 100, 0, True, {f"s{k}": 100.0 for k in range(10)}, slots=slots)
    receivers = [ActorProgress(i, 0, 1, 5, True, {f"own{i}": 20.0}) for i in (1, 2)]
    return decide([source, *receivers], SchedulerConfig(tau=0.7, lam=lam), profile)


def test_a_move_is_made_only_where_it_is_worth_it_by_lam_as_the_plan_weighs_n():
    assert _cost_case(lam=1.0)  # time alone: every move that ends the step sooner
    assert _cost_case(lam=0.7) == []  # 5% sooner for a third more actor-seconds: not worth it


def test_a_source_that_still_queues_sequences_is_not_weighed():
    # Decoding 4 at a time, its ten stragglers take three waves, which a one-batch drain leaves out.
    assert _cost_case(lam=0.7, slots=4)


def test_a_refused_source_is_weighed_again_once_another_move_changed_the_latest_ends():
    # Actor 1's 80-token stragglers are not worth moving (its other 80 keeps its end); once actor
    # 0's 60-token straggler has moved, the step's latest ends differ and actor 1's 40 moves.
    profile = make_profile(step_ms=10, per_seq_ms=1)
    progress = [
        ActorProgress(0, 9, 10, 1, True, {"a0": 10.0, "a1": 10.0, "a2": 60.0}),
        ActorProgress(1, 9, 10, 0, True, {"b0": 20.0, "b1": 80.0, "b2": 80.0, "b3": 40.0}),
        ActorProgress(2, 9, 10, 2, True, {"c0": 20.0}),
    ]
    moves = decide(progress, SchedulerConfig(tau=0.7, lam=0.7), profile)
    assert [(m.sequence, m.source, m.target) for m in moves] == [("a2", 0, 2), ("b3", 1, 2)]
