"""Derived numbers: predictor accuracy from rollouts and the cross-run comparison."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlhfless.report.rundir import Plan, Run, Sample
from rlhfless.report.stats import (
    compare_runs,
    group_lengths,
    phase_parts,
    predictor_score,
    samples_verdict,
    subphase_parts,
)


def _sample(uid: str, k: int, tokens: int | None, predicted: float | None, text: str = "x") -> Sample:
    return Sample(uid=uid, sample=k, response=text, response_tokens=tokens, predicted_length=predicted)


def test_actual_length_is_the_group_max_and_unpredicted_groups_are_left_out() -> None:
    rows = [
        _sample("a", 0, 10, 40.0),
        _sample("a", 1, 70, 40.0),
        _sample("b", 0, 200, None),
        _sample("c", 0, 30, 100.0),
        _sample("c", 1, None, 100.0),
    ]
    predicted, actual = group_lengths(rows)
    assert predicted.tolist() == [40.0, 100.0]
    assert actual.tolist() == [70.0, 30.0]


def test_predictor_score_counts_within_50_tokens_and_rank_agreement() -> None:
    score = predictor_score(np.array([10.0, 100.0, 200.0, 300.0]), np.array([55.0, 170.0, 240.0, 400.0]))
    assert score.groups == 4
    assert score.within == pytest.approx(0.5)  # errors 45, 70, 40, 100
    assert score.tau == pytest.approx(1.0)
    reversed_ranks = predictor_score(np.array([1.0, 2.0, 3.0]), np.array([30.0, 20.0, 10.0]))
    assert reversed_ranks.tau == pytest.approx(-1.0)


def test_predictor_score_of_constant_or_empty_input() -> None:
    assert predictor_score(np.array([]), np.array([])) is None
    assert predictor_score(np.array([5.0, 5.0]), np.array([1.0, 2.0])).tau is None


def _run(name: str, times: list[float], costs: list[float], texts: dict[tuple[int, str, int], str]) -> Run:
    run = Run(path=Path(name), name=name)
    for step, (t, c) in enumerate(zip(times, costs, strict=True), start=1):
        run.metrics[step] = {"time/step": t, "cost/step": c}
    for (step, uid, k), text in texts.items():
        run.rollouts.setdefault(step, []).append(_sample(uid, k, 1, None, text))
    return run


def test_comparison_is_relative_to_the_first_run() -> None:
    texts = {(1, "a", 0): "four", (1, "a", 1): "4"}
    base = _run("verl", [10.0, 14.0], [100.0, 100.0], texts)
    fast = _run("rlhfless", [8.0, 8.0], [60.0, 50.0], texts)
    rows = compare_runs([base, fast])
    assert [r.samples for r in rows] == ["reference", "identical (2 samples)"]
    assert rows[0].speedup == pytest.approx(1.0) and rows[0].cost_reduction == pytest.approx(0.0)
    assert rows[1].mean_step_time == pytest.approx(8.0)
    assert rows[1].speedup == pytest.approx(12.0 / 8.0)
    assert rows[1].cost_reduction == pytest.approx(0.45)


def test_comparison_without_cost_says_nothing_about_cost() -> None:
    base = _run("local", [10.0], [1.0], {})
    del base.metrics[1]["cost/step"]
    other = _run("ray", [5.0], [3.0], {})
    row = compare_runs([base, other])[1]
    assert row.speedup == pytest.approx(2.0)
    assert row.mean_step_cost == pytest.approx(3.0) and row.cost_reduction is None
    assert row.samples == "no rollouts to compare"


def test_samples_verdict_compares_text_over_common_samples_only() -> None:
    a = _run("a", [1.0], [1.0], {(1, "u", 0): "yes", (1, "u", 1): "no", (2, "u", 0): "extra"})
    b = _run("b", [1.0], [1.0], {(1, "u", 0): "yes", (1, "u", 1): "maybe"})
    c = _run("c", [1.0], [1.0], {(3, "v", 0): "yes"})
    assert samples_verdict(a, b) == "differ in 1 of 2 samples"
    assert samples_verdict(a, c) == "no common (step, uid, sample)"


def _phased_run(**metrics: float) -> Run:
    run = Run(path=Path("r"), name="r")
    run.metrics = {1: {"time/generation": 5.0, "time/learning": 2.0, **metrics}, 2: {"time/generation": 4.0}}
    return run


def test_phases_stack_wall_clock_overheads_but_not_summed_function_seconds() -> None:
    run = _phased_run(**{"time/dedup": 0.2, "time/idle": 40.0, "time/cold_start": 9.0, "time/billed": 80.0})
    parts = phase_parts(run)
    assert list(parts) == ["preparation", "generation", "learning", "dedup"]
    assert parts["generation"] == [5.0, 4.0]
    assert parts["preparation"] == [0.0, 0.0] and parts["dedup"] == [0.2, 0.0]


def test_planner_time_prefers_the_metric_over_plan_files() -> None:
    run = _phased_run()
    run.plans[1] = Plan(step=1, n_actors=2, candidates=[], plan_seconds=0.5, policy="rlhfless")
    assert phase_parts(run)["planner"] == [0.5, 0.0]
    run.metrics[2]["time/plan"] = 0.03
    assert phase_parts(run)["planner"] == [0.0, 0.03]


def test_parts_of_a_phase_are_listed_apart_from_the_stack() -> None:
    run = _phased_run(**{"time/prefill": 1.0, "time/reward": 0.1})
    assert "generation: prefill" not in phase_parts(run)
    assert subphase_parts(run) == {"generation: prefill": [1.0, 0.0], "preparation: reward": [0.1, 0.0]}
