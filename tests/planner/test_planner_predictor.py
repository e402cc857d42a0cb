"""Length predictor: EWMA, first-epoch fallback, oracle, noisy mode, state, quality stats."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.planner.prediction_quality import kendall_tau, prediction_quality
from rlhfless.planner.predictor import RATIO_POINTS, LengthPredictor


def test_window_one_predicts_the_last_observation():
    p = LengthPredictor(window=1)
    p.update("a", [10, 30])
    p.update("a", [100, 50, 60])
    gmax, gmean = p.predict(["a"])
    assert gmax[0] == 100 and gmean[0] == 70


def test_longer_window_smooths_over_kept_observations():
    p = LengthPredictor(window=3)  # alpha = 0.5
    for length in (100, 200, 400, 800):
        p.update("a", [length])
    # last three: 200, 400, 800 -> 0.5 * 800 + 0.25 * 400 + 0.25 * 200
    assert p.predict(["a"])[0][0] == pytest.approx(550.0)


def test_unseen_prompts_use_answer_length_then_default():
    p = LengthPredictor(default_length=300, answer_length_factor=2.0)
    gmax, gmean = p.predict(["x", "y"], [40, None])
    assert list(gmax) == [80.0, 300.0] and list(gmean) == [80.0, 300.0]


def test_a_length_resting_on_the_default_alone_is_a_guess_until_its_prompt_or_source_is_seen():
    p = LengthPredictor(default_length=256)
    uids, answers, sources = ["a", "b", "c", "d"], [None, 3, None, None], ["math", "", "math", "poem"]
    p.predict(uids, answers, sources)
    # "b" names no source, so its answer stands in; the others have only the default.
    assert p.guessed(uids, answers, sources).tolist() == [True, False, True, True]
    p.update_many(["a"], [[40, 60]])
    # "a" is seen; "c" takes its source's groups; "poem" was never seen.
    assert p.guessed(uids, answers, sources).tolist() == [False, False, False, True]
    assert p.predict(["c"], None, ["math"])[0][0] == 60


def test_oracle_is_told_the_coming_lengths():
    p = LengthPredictor(mode="oracle")
    p.update("a", [10])
    p.reveal("a", [500, 100])
    assert [v[0] for v in p.predict(["a"])] == [500.0, 300.0]


def test_expected_mode_is_told_each_prompts_expected_group_max_and_mean():
    p = LengthPredictor(mode="expected")
    p.update("a", [10])
    p.reveal_expected("a", 420.5, 300.25)
    uids, sources = ["a", "new"], ["math", "poem"]
    assert [v[0] for v in p.predict(uids, None, sources)] == [420.5, 300.25]
    assert p.guessed(uids, None, sources).tolist() == [False, True]
    p.update_many(["a"], [[100, 200]])  # observed: what it was told no longer holds
    assert [v[0] for v in p.predict(["a"])] == [200.0, 150.0]


def test_noisy_mode_is_deterministic_but_not_exact():
    p = LengthPredictor(mode="noisy", noise=0.5, seed=3)
    uids = [f"u{i}" for i in range(50)]
    for u in uids:
        p.update(u, [200])
    first, again = p.predict(uids), p.predict(uids)
    np.testing.assert_array_equal(first[0], again[0])
    assert np.std(np.log(first[0])) > 0.2


def test_state_round_trips_through_a_file(tmp_path):
    p = LengthPredictor(window=2)
    p.update("a", [10, 20])
    p.update("a", [40])
    p.update("b", [7])
    p.save(tmp_path / "predictor.json")
    q = LengthPredictor(window=2)
    q.load(tmp_path / "predictor.json")
    for got, want in zip(q.predict(["a", "b"]), p.predict(["a", "b"]), strict=True):
        np.testing.assert_allclose(got, want)


def brute_tau_b(x, y):
    pairs = list(itertools.combinations(range(len(x)), 2))
    s = sum(np.sign(x[i] - x[j]) * np.sign(y[i] - y[j]) for i, j in pairs)
    tx = sum(1 for i, j in pairs if x[i] != x[j])
    ty = sum(1 for i, j in pairs if y[i] != y[j])
    return s / np.sqrt(tx * ty) if tx and ty else float("nan")


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=2, max_size=40))
def test_kendall_tau_matches_the_pairwise_definition(points):
    x, y = [p[0] for p in points], [p[1] for p in points]
    np.testing.assert_allclose(kendall_tau(x, y), brute_tau_b(x, y), equal_nan=True)


def test_quality_stats():
    stats = prediction_quality([100, 200, 300, 400], [100, 260, 420, 390])
    assert stats["mae"] == pytest.approx((0 + 60 + 120 + 10) / 4)
    assert stats["within_50"] == 0.5 and stats["within_100"] == 0.75
    assert stats["kendall_tau"] == pytest.approx(brute_tau_b([100, 200, 300, 400], [100, 260, 420, 390]))


observations_st = st.lists(
    st.tuples(st.sampled_from("abcd"), st.lists(st.integers(1, 500), min_size=1, max_size=4)),
    min_size=1,
    max_size=20,
)


@settings(max_examples=60, deadline=None)
@given(observations=observations_st, window=st.integers(1, 3), split=st.integers(0, 20))
def test_batched_updates_equal_one_by_one_updates(observations, window, split):
    one, many = LengthPredictor(window=window), LengthPredictor(window=window)
    for uid, lengths in observations:
        one.update(uid, lengths)
    for part in (observations[:split], observations[split:]):  # a uid may repeat inside a batch
        if part:
            many.update_many([u for u, _ in part], [lengths for _, lengths in part])
    for got, want in zip(many.predict(list("abcd")), one.predict(list("abcd")), strict=True):
        np.testing.assert_allclose(got, want)


def test_batched_update_takes_a_rectangular_array_and_rejects_empty_rows():
    p = LengthPredictor()
    p.update_many(["a", "b"], np.array([[10, 30], [5, 5]]))
    assert p.predict(["a", "b"])[1].tolist() == [20.0, 5.0]
    with pytest.raises(ValueError, match="'b'"):
        p.update_many(["a", "b"], [[1], []])


def test_noisy_predictions_survive_a_checkpoint(tmp_path):
    p = LengthPredictor(mode="noisy", noise=0.5, seed=1)
    for length in (100, 200, 300):
        p.update_many(["a", "b"], [[length], [length + 1]])
    p.save(tmp_path / "predictor.json")
    q = LengthPredictor(mode="noisy", noise=0.5, seed=1)
    q.load(tmp_path / "predictor.json")
    np.testing.assert_array_equal(q.predict(["a", "b"])[0], p.predict(["a", "b"])[0])


@settings(max_examples=60, deadline=None)
@given(
    st.floats(0.5, 20.0),
    st.lists(st.integers(5, 400), min_size=3, max_size=12, unique=True),
    st.lists(st.integers(5, 400), min_size=2, max_size=6, unique=True),
)
def test_answers_that_fit_rank_unseen_prompts_as_their_answers_do(ratio, seen, unseen):
    # A source whose groups run `ratio` times their answers, over two steps (the first teaches
    # the ratio, the second shows it fits): unseen prompts are predicted `ratio` times their
    # answers, so in their answers' order.
    p = LengthPredictor()
    for step in range(2):
        uids = [f"s{step}-{k}" for k in range(len(seen))]
        p.predict(uids, seen, ["src"] * len(seen))
        p.update_many(uids, [[ratio * a, ratio * a] for a in seen])
    new = [f"new-{k}" for k in range(len(unseen))]
    gmax, gmean = p.predict(new, unseen, ["src"] * len(unseen))
    expected = np.maximum(ratio * np.array(unseen, dtype=float), 1.0)
    assert gmax == pytest.approx(expected) and gmean == pytest.approx(expected)
    assert np.argsort(gmax).tolist() == np.argsort(unseen).tolist()


def test_a_steps_samples_over_their_planned_max_are_kept_and_survive_a_resume():
    p = LengthPredictor()
    p.update_many(["a", "b"], [[50, 120], [90, 75]], planned=[100, 60])
    assert p.overrun == [1.2, 1.25, 1.5]  # each sample over its group's planned max / that max, sorted
    q = LengthPredictor()
    q.load_state_dict(p.state_dict())
    assert q.overrun == p.overrun
    p.update_many([f"u{k}" for k in range(1000)], [[k + 1] for k in range(1000)], planned=[100] * 1000)
    assert len(p.overrun) == 256 and p.overrun[0] == 1.01 and p.overrun[-1] == 10.0  # quantiles, ends kept
    with pytest.raises(ValueError, match="planned: got 1 group maxima"):
        p.update_many(["a", "b"], [[1], [2]], planned=[10])


def test_a_step_of_unseen_prompts_is_timed_by_its_sources_scatter_not_by_how_far_it_was_missed():
    """A first step planned from a poor source estimate (here the default) outruns it many times;
    the next unseen prompts take the source's new estimate, so their tail is the scatter around it.
    A step of prompts seen before keeps the ratios over what each was planned with."""
    p = LengthPredictor(default_length=10)
    uids = [f"q{k}" for k in range(8)]
    planned, _ = p.predict(uids, None, ["lcb"] * 8)
    lengths = 100 * np.arange(1, 9)
    p.update_many(uids, lengths[:, None], cap=8192, planned=planned.tolist())
    assert p.max_ratios[-1] == 80.0  # 800 over the default's 10
    estimate = np.quantile(lengths, 8 / 9)  # what 8 unseen prompts of the source now take
    scatter = np.quantile(lengths / estimate, np.linspace(0, 1, RATIO_POINTS))  # alike planned: all kept
    assert p.source_ratios == pytest.approx(scatter.tolist())
    assert p.tail_ratios([f"new{k}" for k in range(8)]) == p.source_ratios
    assert p.tail_ratios(uids) == p.max_ratios
    q = LengthPredictor()
    q.load_state_dict(p.state_dict())
    assert q.source_ratios == p.source_ratios
    # seen prompts, planned from their own lengths: their ratios, and no source ratios from them
    p.update_many(["q0", "q1"], [[150], [300]], cap=8192, planned=[100, 200])
    assert p.max_ratios == pytest.approx([1.5] * RATIO_POINTS)
    assert p.source_ratios == q.source_ratios


def test_told_prompts_are_not_planned_from_their_source():
    """An oracle's prompts are predicted from what it was told, so their step keeps the ratios over
    those predictions and teaches no source ratios."""
    p = LengthPredictor(mode="oracle")
    uids = [f"q{k}" for k in range(4)]
    for uid, length in zip(uids, [100, 200, 300, 400], strict=True):
        p.reveal(uid, [length])
    planned, _ = p.predict(uids, None, ["gsm8k"] * 4)
    p.update_many(uids, [[100], [200], [300], [400]], cap=1024, planned=planned.tolist())
    assert p.max_ratios == pytest.approx([1.0] * RATIO_POINTS) and p.source_ratios == []
    for uid in ("r0", "r1"):
        p.reveal(uid, [50])
    assert p.tail_ratios(["r0", "r1"]) == p.max_ratios


def test_a_steps_group_maxima_over_their_planned_max_are_kept_for_the_longer_half_under_the_cap():
    p = LengthPredictor()
    observed = [[50, 120], [90, 75], [30, 20], [200, 200]]
    p.update_many(["a", "b", "s", "c"], observed, cap=200, planned=[100, 60, 10, 200])
    # a: 120 / 100, b: 90 / 60; s is in the shorter half of the plans under the cap; c was planned
    # at the cap, which it cannot outrun
    assert p.max_ratios == pytest.approx(np.linspace(1.2, 1.5, RATIO_POINTS).tolist())
    q = LengthPredictor()
    q.load_state_dict(p.state_dict())
    assert q.max_ratios == p.max_ratios
    p.update_many(["c"], [[200, 200]], cap=200, planned=[200])  # nothing under the cap: kept as it was
    assert p.max_ratios == q.max_ratios
