"""A seen prompt's history counts as far as histories have lately predicted the next step."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.planner.history_fit import FIT_PROMPTS, FIT_STEPS, HistoryFit
from rlhfless.planner.predictor import LengthPredictor


def test_the_fit_recovers_the_line_from_history_to_the_next_lengths():
    fit = HistoryFit()
    x = np.linspace(100.0, 900.0, 40)
    fit.observe(x, 200.0 + 0.5 * x)
    intercept, slope = fit.line()
    assert slope == pytest.approx(0.5) and intercept == pytest.approx(200.0)
    np.testing.assert_allclose(fit(np.array([100.0, 600.0])), [250.0, 500.0])


def test_too_few_seen_prompts_leave_the_history_as_it_is():
    fit = HistoryFit()
    x = np.arange(FIT_PROMPTS - 1, dtype=float) * 10.0
    fit.observe(x, np.full_like(x, 5.0))
    assert fit.line() == (0.0, 1.0)
    np.testing.assert_array_equal(fit(x), x)


def test_only_the_last_steps_are_fitted():
    fit = HistoryFit()
    x = np.linspace(0.0, 100.0, FIT_PROMPTS)
    fit.observe(x, np.full_like(x, 50.0))  # a step whose history said nothing
    for _ in range(FIT_STEPS):
        fit.observe(x, x)  # then steps where it said all
    assert fit.line() == pytest.approx((0.0, 1.0))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(1.0, 8192.0), min_size=FIT_PROMPTS, max_size=64),
    st.floats(-3.0, 3.0),
    st.floats(-500.0, 500.0),
)
def test_a_history_never_counts_for_more_than_itself_nor_against_itself(history, slope, shift):
    """Lengths on a line from their histories: its slope, held within [0, 1]."""
    x = np.array(history)
    fit = HistoryFit()
    fit.observe(x, shift + slope * x)
    _, fitted = fit.line()
    assert 0.0 <= fitted <= 1.0
    if np.ptp(x) > 0.01 * x.max():  # a spread the sums hold to well within the tolerance
        assert fitted == pytest.approx(min(max(slope, 0.0), 1.0), abs=1e-6)


def steps_of(predictor: LengthPredictor, lengths: np.ndarray) -> None:
    """One step per column of `lengths` (prompts x steps), one sample each, as a run records them."""
    uids = [f"p{i}" for i in range(lengths.shape[0])]
    for k in range(lengths.shape[1]):
        planned = predictor.predict(uids)[0]  # as a run plans the step, then records it
        predictor.update_many(uids, lengths[:, k : k + 1], planned=planned)


def test_a_history_that_says_nothing_of_the_next_step_gives_way_to_the_seen_prompts_mean():
    rng = np.random.default_rng(0)
    p = LengthPredictor()
    steps_of(p, rng.uniform(100.0, 900.0, size=(64, 4)))  # every step a fresh draw per prompt
    last = p.state_dict()["history"]
    history = np.array([last[f"p{i}"][-1][0] for i in range(64)])
    gmax, _ = p.predict([f"p{i}" for i in range(64)])
    assert p.max_fit.line()[1] < 0.3
    assert gmax.std() < 0.3 * history.std()
    assert abs(gmax.mean() - history.mean()) < 0.1 * history.mean()


def test_a_history_that_holds_from_step_to_step_is_taken_as_it_is():
    rng = np.random.default_rng(1)
    stable = rng.uniform(100.0, 900.0, size=(64, 1))
    p = LengthPredictor()
    steps_of(p, np.repeat(stable, 4, axis=1))
    gmax, gmean = p.predict([f"p{i}" for i in range(64)])
    np.testing.assert_allclose(gmax, stable[:, 0])
    np.testing.assert_allclose(gmean, stable[:, 0])


def test_the_fit_survives_a_resume_and_told_modes_are_not_fitted(tmp_path):
    rng = np.random.default_rng(2)
    lengths = rng.uniform(100.0, 900.0, size=(32, 3))
    p = LengthPredictor()
    steps_of(p, lengths)
    p.save(tmp_path / "predictor.json")
    q = LengthPredictor()
    q.load(tmp_path / "predictor.json")
    uids = [f"p{i}" for i in range(32)]
    np.testing.assert_allclose(q.predict(uids)[0], p.predict(uids)[0])
    assert q.max_fit.line() == p.max_fit.line() != (0.0, 1.0)
    oracle = LengthPredictor(mode="oracle")
    steps_of(oracle, lengths)
    assert oracle.max_fit.sums == []


def test_where_answers_fit_a_history_counts_only_for_what_it_adds_to_them():
    """Lengths that follow each prompt's answer, plus noise drawn anew each step: the answers say
    all there is to say, so a seen prompt is predicted near its answer's estimate, not its last
    draw, nor the seen prompts' mean."""
    rng = np.random.default_rng(3)
    uids = [f"p{i}" for i in range(64)]
    answers = rng.integers(20, 200, size=64)
    sources = ["gsm8k"] * 64
    p = LengthPredictor()
    for _ in range(4):
        planned = p.predict(uids, answers.tolist(), sources)[0]
        drawn = 3.0 * answers * np.exp(rng.normal(0.0, 0.15, size=64))
        p.update_many(uids, drawn[:, None], planned=planned)
    gmax, _ = p.predict(uids, answers.tolist(), sources)
    assert p.sources.answers_fit("gsm8k")
    last = np.array([h[-1][0] for h in (p.state_dict()["history"][u] for u in uids)])
    truth = 3.0 * answers
    assert np.abs(gmax - truth).mean() < 0.5 * np.abs(last - truth).mean()
