"""The length pilot samples more prompts of each source only where the profile decodes them at
about the step time of the prompts asked for, or where a cluster's many actors make its one cheap."""

from hypothesis import given
from hypothesis import strategies as st
from planner_support import make_profile

from rlhfless.planner.hardware import ModelShape, roofline_profile
from rlhfless.planner.pilot import JUDGED, MOST, SLOWER, pilot_prompts
from rlhfless.planner.source_lengths import ANSWER_GROUPS


def test_a_step_bound_by_reading_the_weights_widens_the_pilot_one_growing_with_the_batch_does_not():
    flat = make_profile(step_ms=100.0, per_seq_ms=0.1)  # 16 prompts of 4: +6.3% a step
    steep = make_profile(step_ms=1.0, per_seq_ms=1.0)  # the step grows with every sequence
    assert pilot_prompts(flat, 1, 4, 300.0) == MOST
    assert pilot_prompts(steep, 1, 4, 300.0) == 1
    assert pilot_prompts(steep, 3, 4, 300.0) == 3  # never fewer than asked
    assert pilot_prompts(flat, 0, 4, 300.0) == 0  # no pilot asked: none
    # KV memory for 40 sequences of 300 tokens: 10 prompts of 4 at once, however flat the step
    assert pilot_prompts(make_profile(step_ms=100.0, max_kv_tokens=12_000), 1, 4, 300.0) == 10


def test_on_a_memory_bound_gpu_the_pilot_samples_several_prompts_enough_to_judge_answers():
    profile = roofline_profile(ModelShape.resolve("llama-2-70b"), "h100", 8)
    assert 2 <= pilot_prompts(profile, 1, 4, 1200.0) < MOST


def test_on_a_cluster_the_pilot_samples_enough_prompts_for_the_answer_rule_to_be_judged():
    steep = make_profile(step_ms=1.0, per_seq_ms=1.0)
    short = make_profile(step_ms=100.0, max_kv_tokens=600)  # one prompt of 4 at a time: waves
    assert JUDGED > ANSWER_GROUPS  # every judged group, and one to spare for a group at the cap
    assert pilot_prompts(steep, 1, 4, 300.0, actors=JUDGED + 1) == JUDGED
    assert pilot_prompts(short, 1, 4, 150.0, actors=64) == JUDGED
    assert pilot_prompts(steep, 1, 4, 300.0, actors=2) == 1  # two CPU slots: as asked
    assert pilot_prompts(steep, 0, 4, 300.0, actors=64) == 0  # no pilot asked: none


@given(
    step_ms=st.floats(0.1, 100.0),
    per_seq_ms=st.floats(0.0, 10.0),
    at_least=st.integers(0, 2 * MOST),
    group=st.integers(1, 16),
    context=st.floats(1.0, 8192.0),
)
def test_the_pilot_is_never_narrower_than_asked_and_its_step_at_most_slower_by_the_bound(
    step_ms, per_seq_ms, at_least, group, context
):
    profile = make_profile(step_ms=step_ms, per_seq_ms=per_seq_ms, max_kv_tokens=1 << 20)
    n = pilot_prompts(profile, at_least, group, context)
    assert n >= at_least and n <= max(at_least, MOST)
    if 0 < at_least < n:
        wide, asked = profile.decode_step_seconds([n * group, at_least * group], context)
        assert wide <= SLOWER * asked
        assert n * group <= profile.concurrency(context)
