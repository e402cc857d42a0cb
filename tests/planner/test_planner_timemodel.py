"""T(X, G): continuous batching estimate against hand-computed cases."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planner_support import make_profile

from rlhfless.planner.tail import SPREAD, Tail, expected_end
from rlhfless.planner.timemodel import PromptSegments, RangeModel, Workload


def workload(gmax, gmean=None, g=1, prompt=10):
    gmax = np.asarray(gmax, dtype=float)
    gmean = gmax if gmean is None else np.asarray(gmean, dtype=float)
    n = gmax.size
    zeros = np.zeros(n, dtype=np.int64)
    return Workload(gmax, gmean, np.full(n, prompt), zeros, zeros, g)


def decode_time(w, profile, segments=8):
    model = RangeModel(w, np.arange(w.size), profile, segments)
    return float(model.times(np.array([0]), np.array([w.size]))["decode"][0])


def test_one_sequence_takes_its_length_in_steps():
    assert decode_time(workload([100]), make_profile(step_ms=10)) == pytest.approx(1.0)


def test_batch_shrinks_as_sequences_finish():
    # step = 10 ms + 1 ms per running sequence; lengths 100, 200, 300 run together:
    # 100 steps at batch 3, 100 at batch 2, 100 at batch 1.
    expected = (100 * 13 + 100 * 12 + 100 * 11) / 1e3
    got = decode_time(workload([100, 200, 300]), make_profile(step_ms=10, per_seq_ms=1), segments=3)
    assert got == pytest.approx(expected)


def test_group_samples_keep_the_predicted_mean():
    # G = 4, max 400, mean 250 -> one sample of 400 and three of 200: 200 steps at batch 4, 200 at 1.
    expected = (200 * 14 + 200 * 11) / 1e3
    got = decode_time(workload([400], [250], g=4), make_profile(step_ms=10, per_seq_ms=1))
    assert got == pytest.approx(expected)


def test_kv_cap_queues_sequences_and_costs_time():
    lengths = [100] * 8
    free = decode_time(workload(lengths), make_profile(step_ms=10))
    capped = decode_time(workload(lengths), make_profile(step_ms=10, max_kv_tokens=2 * 110))
    assert free == pytest.approx(1.0)
    assert capped == pytest.approx(4.0)  # two at a time: 8 * 100 tokens / 2 per step


def test_a_few_queued_sequences_among_spread_lengths_start_early_and_end_with_the_longest():
    # Ten sequences of 100..1000 tokens, slots for 8 (KV memory at their mean final length): the
    # 200- and 100-token ones start when the 300 and the 400 end and are done by step 500, so the
    # actor takes its longest sequence's 1000 steps (plus the steps the early 10-wide batch needs).
    lengths = np.arange(100.0, 1001.0, 100.0)
    profile = make_profile(step_ms=10, max_kv_tokens=8 * (10 + 550))
    got = decode_time(workload(lengths), profile, segments=10)
    assert 10.0 <= got <= 10.0 * 1.05


def test_the_longest_sequence_runs_beside_the_waves_of_short_ones():
    # One of 1,000 tokens and 36 of 100 on three slots (flat 10 ms steps): the long one starts
    # first and the short ones pass through the other two slots, then the third: 1,600 steps when
    # longest first takes the first free slot, not 1,000 after the 3,600 / 3 of the waves.
    lengths = np.r_[1000.0, np.full(36, 100.0)]
    profile = make_profile(step_ms=10, max_kv_tokens=405)  # 3 slots at the mean final length, 134
    got = decode_time(workload(lengths), profile)
    assert got == pytest.approx(16.0, rel=0.05)


def test_a_second_wave_of_alike_sequences_adds_steps_at_their_own_batch():
    # Five of 100 tokens, three slots, step = 10 ms + 1 ms per sequence: three run 100 steps at
    # batch 3, then two run 100 steps at batch 2 (2.5 s). The model runs the tokens at the full
    # batch (500 / 3 steps) and adds the missing steps at their fixed part.
    profile = make_profile(step_ms=10, per_seq_ms=1, max_kv_tokens=3 * 110)
    got = decode_time(workload([100.0] * 5), profile)
    assert got == pytest.approx(500 / 3 * 0.013 + (200 - 500 / 3) * 0.011)
    assert got == pytest.approx(2.5, rel=0.02)


def test_ranges_are_timed_independently():
    w = workload([50, 100, 400, 800])
    model = RangeModel(w, np.arange(4), make_profile(step_ms=10), 8)
    times = model.times(np.array([0, 2, 0]), np.array([2, 4, 4]))["decode"]
    np.testing.assert_allclose(times, [1.0, 8.0, 8.0])


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 3000), min_size=2, max_size=40),
    seed=st.integers(0, 2**16),
    g=st.sampled_from([1, 4]),
    tailed=st.booleans(),
)
def test_segments_reordered_time_ranges_as_a_model_built_in_that_order(lengths, seed, g, tailed):
    """`PromptSegments.reordered` (the backfilled order's model, verl's input order) gives the
    very figures a model built from scratch in that order gives."""
    gmax = np.array(lengths, dtype=float)
    w = workload(gmax, gmax * 0.6 if g > 1 else None, g=g)
    if tailed:
        w = _with_tail(w, Tail((0.5, 0.9, 1.0, 1.4), 4000.0))
    profile = make_profile(step_ms=10, per_seq_ms=1, max_kv_tokens=2_000)
    rng = np.random.default_rng(seed)
    first, then = rng.permutation(w.size), rng.permutation(w.size)
    starts = np.sort(rng.integers(0, w.size, 5))
    ends = np.minimum(starts + rng.integers(1, w.size + 1, 5), w.size)
    built = RangeModel(w, then, profile, 8).times(starts, ends)
    moved = RangeModel.over(w, PromptSegments.of(w, first, 8).reordered(then), profile).times(starts, ends)
    for key, value in built.items():
        np.testing.assert_array_equal(moved[key], value, err_msg=key)


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=6),
    g=st.sampled_from([1, 4]),
    tailed=st.booleans(),
    kv=st.sampled_from([10**6, 2_000]),
)
def test_a_fixed_split_timed_in_blocks_is_timed_as_its_ranges(lengths, cuts, g, tailed, kv):
    """`blocks` sums each range once instead of every prompt's prefix: the same figures, empty
    ranges included (a range of no prompts takes no time)."""
    gmax = np.array(lengths, dtype=float)
    w = workload(gmax, gmax * 0.6 if g > 1 else None, g=g)
    if tailed:
        w = _with_tail(w, Tail((0.5, 0.9, 1.0, 1.4), 4000.0))
    profile = make_profile(step_ms=10, per_seq_ms=1, max_kv_tokens=kv)
    starts = np.array(sorted({0, *(min(c, w.size) for c in cuts)}))
    ends = np.r_[starts[1:], w.size]
    ranges = RangeModel(w, np.arange(w.size), profile, 8).times(starts, ends)
    blocks = np.arange(starts.size)
    summed = RangeModel(w, np.arange(w.size), profile, 8, blocks=starts).times(blocks, blocks + 1)
    assert ranges.keys() == summed.keys()
    for key, value in ranges.items():
        np.testing.assert_allclose(summed[key], value, rtol=1e-9, atol=1e-9, err_msg=key)


def _with_tail(w, tail):
    return Workload(
        w.group_max, w.group_mean, w.prompt_tokens, w.decode_prefill, w.kv_tokens, w.group_size, tail
    )


@pytest.mark.parametrize("n", [1, 4, 32])
def test_a_range_is_timed_to_the_expected_longest_of_its_groups_past_its_longest_prediction(n):
    """Observed group maxima are their predictions times ratios uniform on [0.5, 1.5]: n groups
    predicted at 100 end, on average, at 50 + 100 n / (n + 1); the steps past 100 run alone."""
    profile = make_profile(step_ms=10)
    alike = workload([100] * n)
    tail = Tail(tuple(np.linspace(0.5, 1.5, 129)))
    extra = decode_time(_with_tail(alike, tail), profile) - decode_time(alike, profile)
    longest = 50 + 100 * n / (n + 1)
    assert extra == pytest.approx(max(longest - 100, 0.0) * 0.010, abs=0.01)


@settings(max_examples=40, deadline=None)
@given(
    maxima=st.lists(st.integers(1, 60) | st.floats(1.0, 60.0), min_size=1, max_size=30),
    cap=st.sampled_from([None, 50.0]),
)
def test_each_prompt_s_tail_row_is_its_own_prediction_s(maxima, cap):
    """Repeated whole counts share one row of log P (interpolated once), smoothed values have
    rows of their own: either way a prompt's row is what its prediction alone would give."""
    tail = Tail((0.5, 0.9, 1.0, 1.4), cap)
    group_max = np.array(maxima, dtype=float)
    y, rows, row_of = tail.log_below(group_max)
    for i, p in enumerate(group_max):
        alone_y, alone, _ = tail.log_below(np.array([p, group_max.max()]))
        np.testing.assert_array_equal(alone_y, y)
        np.testing.assert_array_equal(rows[row_of[i]], alone[0])


def test_the_tail_stops_at_the_cap_and_a_run_without_one_is_timed_by_its_predictions():
    profile = make_profile(step_ms=10)
    alike = workload([100] * 32)
    capped = Tail(tuple(np.linspace(0.5, 1.5, 129)), cap=110.0)
    extra = decode_time(_with_tail(alike, capped), profile) - decode_time(alike, profile)
    assert 0.0 < extra <= 0.10 + 1e-9  # at most the 10 steps to the cap
    assert Tail.of([], 110.0) is None and Tail.of([1.0], None) is None  # no ratios, or one: no tail


def test_exact_predictions_have_no_tail():
    """Every group ran exactly its prediction (ratios all 1): no range is timed past its longest."""
    profile = make_profile(step_ms=10)
    w = workload([100, 300, 700] * 8)
    exact = Tail(tuple([1.0] * 129), cap=1024.0)
    assert decode_time(_with_tail(w, exact), profile) == pytest.approx(decode_time(w, profile))


def test_a_cap_far_past_the_predictions_keeps_the_tail_as_fine_as_without_one():
    """The lengths the expected longest is integrated on end at the longest prediction times the
    largest ratio, not at an 8k cap 80x the predictions (at the cap they were 512 tokens apart, and
    four groups predicted at 100 came out at their bound, 150, not 130)."""
    profile = make_profile(step_ms=10)
    alike = workload([100] * 4)
    ratios = tuple(np.linspace(0.5, 1.5, 129))
    for cap in (None, 8192.0):
        extra = decode_time(_with_tail(alike, Tail(ratios, cap)), profile) - decode_time(alike, profile)
        assert extra == pytest.approx((50 + 100 * 4 / 5 - 100) * 0.010, abs=0.01)


def test_a_plan_whose_actors_end_alike_ends_later_than_any_one_of_them():
    """Eight actors of four groups each, every group predicted at 100 and observed at 100 times a
    ratio uniform on [0.5, 1.5]; a step past 100 takes 10 ms. Each actor alone is expected to end
    at 1 s plus its longest group's outrun; the plan ends with the last of the eight, later, as
    Monte Carlo draws of the same groups say."""
    profile = make_profile(step_ms=10)
    w = _with_tail(workload([100] * 32), Tail(tuple(np.linspace(0.5, 1.5, 129))))
    starts = np.arange(0, 32, 4)
    parts = RangeModel(w, np.arange(32), profile, 8).times(starts, starts + 4)
    one = expected_end(parts["decode"][:1], np.array([0]), {k: parts[k][:1] for k in SPREAD})[0]
    eight = expected_end(parts["decode"], np.array([0]), parts)[0]
    longest = (100 * np.random.default_rng(0).uniform(0.5, 1.5, (100_000, 8, 4))).max(axis=2)
    ends = 1.0 + np.maximum(longest - 100, 0.0) * 0.010
    assert one == pytest.approx(ends[:, 0].mean(), rel=0.01)
    assert eight == pytest.approx(ends.max(axis=1).mean(), rel=0.01)
    assert eight > parts["decode"].max() + 0.1  # the latest expected end alone misses most of it


def test_without_a_tail_a_plan_ends_with_its_latest_actor():
    ends = np.array([1.0, 3.0, 2.0, 5.0, 4.0])
    np.testing.assert_array_equal(expected_end(ends, np.array([0, 3])), [3.0, 5.0])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 2000), min_size=1, max_size=40),
    st.integers(1, 8),
    st.floats(0.05, 0.6),
    st.sampled_from([None, 1024.0, 8192.0]),
)
def test_a_plan_ends_no_sooner_than_its_latest_actor_and_no_later_than_any_group_can_run(
    lengths, actors, spread, cap
):
    """Whatever the predictions, ratios and cap, the expected end of a plan lies between its
    latest actor's forecast and the latest end that any of its groups' largest ratio allows."""
    ratios = tuple(np.exp(np.random.default_rng(len(lengths)).normal(0.0, spread, 129)).round(6))
    w = _with_tail(workload(lengths), Tail(tuple(sorted(ratios)), cap))
    bounds = np.linspace(0, len(lengths), min(actors, len(lengths)) + 1).astype(int)
    parts = RangeModel(w, np.arange(len(lengths)), make_profile(step_ms=10), 8).times(bounds[:-1], bounds[1:])
    end = parts["decode"]
    got = expected_end(end, np.array([0]), parts)[0]
    reach = np.minimum(parts["longest"] * parts["most"], parts["tail_top"])
    latest = (end - parts["outrun"] + np.maximum(reach - parts["longest"], 0.0) * parts["step1"]).max()
    assert end.max() - 1e-9 <= got <= latest + 1e-9
