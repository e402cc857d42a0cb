"""The learning phase's width."""

import math

from rlhfless.planner.learning import learner_width, rank_start_delay


def test_the_width_takes_every_free_slot_unless_told_and_never_more_ranks_than_groups():
    assert learner_width(0, 2, 8) == 2
    assert learner_width(1, 2, 8) == 1
    assert learner_width(4, 2, 8) == 2
    assert learner_width(0, 4, 3) == 3
    assert learner_width(0, 0, 3) == 1


def test_extra_ranks_are_requested_one_cold_start_before_generation_is_forecast_to_end():
    assert rank_start_delay(30.0, 6.0) == 24.0
    assert rank_start_delay(4.0, 6.0) == 0.0  # a start longer than generation: at once
    assert rank_start_delay(30.0, None) == math.inf  # not measured yet: when learning begins
