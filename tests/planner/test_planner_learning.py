"""The learning phase's width."""

from rlhfless.planner.learning import learner_width


def test_the_width_takes_every_free_slot_unless_told_and_never_more_ranks_than_groups():
    assert learner_width(0, 2, 8) == 2
    assert learner_width(1, 2, 8) == 1
    assert learner_width(4, 2, 8) == 2
    assert learner_width(0, 4, 3) == 3
    assert learner_width(0, 0, 3) == 1
