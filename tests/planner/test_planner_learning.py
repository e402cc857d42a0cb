"""The learning phase's width."""

from hypothesis import given
from hypothesis import strategies as st

from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.learning import (
    LearningHistory,
    generation_left_s,
    learn_ahead_fits,
    learner_width,
    rank_start_estimate,
    start_ranks_ahead,
    start_ranks_now,
    width_table,
)
from rlhfless.planner.migration import ActorProgress


def actor(i: int, remaining: dict[str, float], running: bool = True) -> ActorProgress:
    return ActorProgress(i, 0, len(remaining), 0, running, remaining)


def test_the_width_takes_every_free_slot_unless_told_and_never_more_ranks_than_groups():
    assert learner_width(0, 2, 8) == 2
    assert learner_width(1, 2, 8) == 1
    assert learner_width(4, 2, 8) == 2
    assert learner_width(0, 4, 3) == 3
    assert learner_width(0, 0, 3) == 1


def test_a_measured_phase_prices_each_width_by_its_time_and_its_extra_rank_starts():
    # 36 s of learning at width 1, a rank start of 6 s: width 2 learns in 18 s for 6 slot-s more
    scheduler = SchedulerConfig(lam=0.7, price_per_gpu_hour=3600.0)  # $1 a slot-second
    table = width_table(LearningHistory(1, 36.0, 6.0), 2, scheduler)
    assert table.time.tolist() == [36.0, 18.0]
    assert table.cost.tolist() == [36.0, 42.0]
    assert learner_width(0, 2, 8, LearningHistory(1, 36.0, 6.0), scheduler) == 2


def test_a_width_whose_rank_starts_cost_more_than_its_time_saves_is_not_taken():
    tiny = LearningHistory(2, 0.5, 6.0)  # a tiny step: 1 s of learning, 6 s to start a rank
    assert learner_width(0, 2, 8, tiny, SchedulerConfig(lam=0.7)) == 1
    assert learner_width(0, 2, 8, tiny, SchedulerConfig(lam=1.0)) == 2  # time only
    assert learner_width(0, 4, 8, LearningHistory(1, 36.0, 6.0), SchedulerConfig(lam=0.0)) == 1  # cost only
    # starts not billed: every width costs the same, so the fastest wins at any lam > 0
    free_starts = SchedulerConfig(lam=0.1, bill_cold_start=False)
    assert learner_width(0, 4, 8, tiny, free_starts) == 4


def test_a_warm_function_gives_its_slot_to_the_phase_when_its_restart_costs_less_than_it_saves():
    # Step 7 of a CPU run: a decode function kept warm held the second slot, so learning took
    # 28 s on one while the function idled, billed, all 28 s. Stopping it saves that idle bill
    # and 14 s of learning for one 4.5 s cold start at its next use.
    scheduler = SchedulerConfig(lam=0.7, price_per_gpu_hour=3600.0)  # $1 a slot-second
    phase = LearningHistory(1, 28.0, 1.0)
    table = width_table(phase, 2, scheduler, free=1, cold_start_s=4.5)
    assert table.time.tolist() == [28.0, 14.0 + 4.5]
    assert table.cost.tolist() == [28.0 + 28.0, 28.0 + 1.0 + 4.5]  # kept idle; one rank start, one restart
    assert learner_width(0, 1, 8, phase, scheduler, warm=1, cold_start_s=4.5) == 2
    # a restart dearer than the phase: the function stays warm, the phase keeps to the free slot
    assert learner_width(0, 1, 8, phase, scheduler, warm=1, cold_start_s=100.0) == 1
    assert learner_width(0, 1, 8, warm=1) == 2  # before a phase was measured: every slot


def test_ranks_started_as_the_phase_opens_make_it_wait_one_rank_start():
    # 10 s of learning alone, a 6 s rank start: started in generation's tail, width 2 learns in 5 s;
    # started as the phase opens, it takes 5 + 6 s, slower than one rank alone
    phase, scheduler = LearningHistory(1, 10.0, 6.0), SchedulerConfig(lam=0.7)
    assert width_table(phase, 2, scheduler, exposed=True).time.tolist() == [10.0, 11.0]
    assert learner_width(0, 2, 8, phase, scheduler) == 2
    assert learner_width(0, 2, 8, phase, scheduler, exposed=True) == 1


@given(
    free=st.integers(0, 16),
    groups=st.integers(1, 16),
    width=st.integers(1, 16),
    seconds=st.floats(0.01, 1e4),
    start=st.floats(0.0, 1e3),
    lam=st.floats(0.0, 1.0),
    warm=st.integers(0, 4),
    restart=st.floats(0.0, 1e3),
)
def test_the_width_is_always_a_placeable_one_and_time_only_takes_all(
    free, groups, width, seconds, start, lam, warm, restart
):
    history = LearningHistory(width, seconds, start)
    most = max(1, min(free, groups))
    assert 1 <= learner_width(0, free, groups, history, SchedulerConfig(lam=lam)) <= most
    assert learner_width(0, free, groups, history, SchedulerConfig(lam=1.0)) == most
    # warm functions' slots are placeable too (they give way), and none is stopped for nothing
    reach = max(1, min(free + warm, groups))
    got = learner_width(0, free, groups, history, SchedulerConfig(lam=lam), warm, restart)
    assert 1 <= got <= reach
    if restart >= seconds * width:  # a restart longer than the whole phase never pays in time
        assert learner_width(0, free, groups, history, SchedulerConfig(lam=1.0), warm, restart) == most


def test_generation_ends_when_the_slowest_actor_decodes_its_longest_remaining_sequence():
    actors = [actor(0, {"a#0": 40.0, "a#1": 10.0}), actor(1, {"b#0": 20.0})]
    assert generation_left_s(actors, {0: 0.1, 1: 0.5}) == 10.0  # actor 1: 20 tokens x 0.5 s
    assert generation_left_s(actors, {0: 0.5, 1: 0.1}) == 20.0  # actor 0: 40 tokens x 0.5 s


def test_finished_or_released_actors_do_not_count_and_an_unmeasured_live_one_makes_it_unknown():
    done = [actor(0, {}), actor(1, {"b#0": 20.0}, running=False)]
    assert generation_left_s(done, {}) == 0.0
    assert generation_left_s([actor(0, {"a#0": 5.0}), actor(1, {"b#0": 9.0})], {0: 0.1}) is None


def test_extra_ranks_are_requested_once_generation_is_within_one_measured_rank_start():
    assert start_ranks_now(5.9, 6.0)
    assert not start_ranks_now(6.1, 6.0)
    assert not start_ranks_now(None, 6.0)  # no actor measured yet
    assert not start_ranks_now(0.0, None)  # no start measured yet: when learning begins


def test_a_rank_start_is_the_longest_of_the_last_three_and_before_any_a_functions_cold_start():
    assert rank_start_estimate([9.0, 5.0, 6.0, 5.5], 4.6) == 6.0  # the last three, not the first
    assert rank_start_estimate([], 4.6) == 4.6  # the first phase: a function's cold start
    assert rank_start_estimate([], 0.0) is None  # nothing known: ranks start as learning begins


def test_ranks_start_ahead_once_the_waiting_groups_keep_the_first_busy_to_generations_end():
    # 20 s of generation left, a 6 s start: 14 s of waiting groups fill the rest, 13 do not.
    assert start_ranks_ahead(20.0, 6.0, ready_s=14.0, group_s=3.0)
    assert not start_ranks_ahead(20.0, 6.0, ready_s=13.0, group_s=3.0)  # it would idle, billed
    assert not start_ranks_ahead(8.0, 6.0, ready_s=30.0, group_s=3.0)  # no group fits after the start
    assert not start_ranks_ahead(None, 6.0, 10.0, 3.0) and not start_ranks_ahead(20.0, None, 30.0, 3.0)
    assert not start_ranks_ahead(20.0, 6.0, 30.0, None)  # no phase measured: no seconds a token


@given(st.floats(0, 100), st.floats(0, 100), st.floats(0, 50), st.floats(0, 50))
def test_a_started_rank_never_takes_a_group_it_is_forecast_to_finish_after_generation(
    left, start, ready, group
):
    assert learn_ahead_fits(left, ready, group) == (ready + group <= left)
    if start_ranks_ahead(left, start, ready + group, group):
        assert learn_ahead_fits(left, start, group)  # the first group fits behind the start
    assert not learn_ahead_fits(None, 0.0, 1.0) and not learn_ahead_fits(10.0, 0.0, None)
