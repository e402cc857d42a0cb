"""The learning phase's width."""

from rlhfless.planner.learning import generation_left_s, learner_width, start_ranks_now
from rlhfless.planner.migration import ActorProgress


def actor(i: int, remaining: dict[str, float], running: bool = True) -> ActorProgress:
    return ActorProgress(i, 0, len(remaining), 0, running, remaining)


def test_the_width_takes_every_free_slot_unless_told_and_never_more_ranks_than_groups():
    assert learner_width(0, 2, 8) == 2
    assert learner_width(1, 2, 8) == 1
    assert learner_width(4, 2, 8) == 2
    assert learner_width(0, 4, 3) == 3
    assert learner_width(0, 0, 3) == 1


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
