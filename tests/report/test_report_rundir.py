"""Reading recorded run directories: whatever is missing or damaged is skipped and described."""

from __future__ import annotations

import json
from pathlib import Path

from report_fake_run import write_fake_run

from rlhfless.report.rundir import load_run, run_names


def test_complete_run_reads_every_documented_file(tiny_run: Path) -> None:
    run = load_run(tiny_run)
    assert run.problems == []
    assert run.steps == [1, 2, 3]
    assert run.has("cost/step") and run.has("plan/predicted_time")
    assert sorted(run.rollouts) == sorted(run.plans) == sorted(run.timelines) == [1, 2, 3]
    assert len(run.rollouts[1]) == 6 * 4
    plan = run.plans[2]
    assert plan.chosen is not None and plan.chosen.n == plan.n_actors
    kinds = {f.kind for f in run.timelines[1].functions}
    assert {"learner", "prefill", "decode", "reference", "reward"} <= kinds
    assert run.config_text is not None and "grpo" in run.config_text


def test_truncated_metrics_line_is_skipped_and_reported(tmp_path: Path) -> None:
    path = write_fake_run(tmp_path / "run", steps=3)
    text = (path / "metrics.jsonl").read_text()
    (path / "metrics.jsonl").write_text(text[: len(text) - 40])  # killed while writing step 3
    run = load_run(path)
    assert run.steps == [1, 2]
    assert any("metrics.jsonl line 3" in p for p in run.problems)


def test_resumed_run_keeps_the_last_record_of_a_repeated_step(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "time/step": 5.0}\n{"step": 2, "time/step": 9.0}\n{"step": 2, "time/step": 7.0}\n'
    )
    run = load_run(tmp_path)
    assert run.series("time/step") == ([1, 2], [5.0, 7.0])


def test_null_nan_and_text_values_are_not_numbers(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "kl/mean": null, "loss/policy": NaN, "reward/mean": "high", "time/step": 2}\n'
    )
    run = load_run(tmp_path)
    assert run.metrics[1] == {"step": 1.0, "time/step": 2.0}
    assert not run.has("kl/mean")


def test_truncated_plan_and_timeline_files_are_skipped(tmp_path: Path) -> None:
    path = write_fake_run(tmp_path / "run", steps=2)
    for folder in ("plans", "timeline"):
        file = path / folder / "step_000002.json"
        file.write_text(file.read_text()[:100])
    run = load_run(path)
    assert sorted(run.plans) == sorted(run.timelines) == [1]
    assert any("plans/step_000002.json is not valid JSON" in p for p in run.problems)
    assert any("timeline/step_000002.json is not valid JSON" in p for p in run.problems)


def test_timeline_function_without_times_is_dropped_with_a_note(tmp_path: Path) -> None:
    path = write_fake_run(tmp_path / "run", steps=1)
    file = path / "timeline" / "step_000001.json"
    timeline = json.loads(file.read_text())
    del timeline["functions"][0]["released"]
    timeline["functions"][1]["busy"] = [[1.0], "x", [3.0, 2.0]]
    timeline["functions"][1]["events"] = [{"kind": "cut"}]
    file.write_text(json.dumps(timeline))
    run = load_run(path)
    functions = run.timelines[1].functions
    assert len(functions) == len(timeline["functions"]) - 1
    assert functions[0].busy == [] and functions[0].events == []
    assert any("1 function(s) without valid" in p for p in run.problems)


def test_plan_keeps_only_complete_candidate_rows(tmp_path: Path) -> None:
    (tmp_path / "plans").mkdir()
    plan = {"n_actors": 2, "candidates": [{"n": 2, "time": 1, "cost": 2, "score": 0}, {"n": 3, "time": 1}]}
    (tmp_path / "plans" / "step_000001.json").write_text(json.dumps(plan))
    run = load_run(tmp_path)
    assert [c.n for c in run.plans[1].candidates] == [2]
    assert run.plans[1].chosen.cost == 2.0


def test_empty_or_absent_directory_reports_instead_of_raising(tmp_path: Path) -> None:
    assert load_run(tmp_path).problems == ["no metrics.jsonl"]
    absent = load_run(tmp_path / "nope")
    assert absent.metrics == {} and "is not a directory" in absent.problems[0]


def test_rollout_lines_without_identity_are_skipped(tmp_path: Path) -> None:
    path = write_fake_run(tmp_path / "run", steps=1, prompts=2, samples=2)
    file = path / "rollouts" / "step_000001.jsonl"
    file.write_text(file.read_text() + '{"response": "orphan"}\n{"uid": "gsm8k-0", "sam')
    run = load_run(path)
    assert len(run.rollouts[1]) == 4
    assert len(run.problems) == 2


def test_run_names_are_distinct(tmp_path: Path) -> None:
    a, b = tmp_path / "x" / "run", tmp_path / "y" / "run"
    assert run_names([a, b, tmp_path / "z"]) == ["run", "run#2", "z"]


def test_timeline_nodes_and_transfers_are_read_and_unreadable_ones_reported(tmp_path: Path) -> None:
    path = write_fake_run(tmp_path / "run", steps=1)
    file = path / "timeline" / "step_000001.json"
    timeline = json.loads(file.read_text())
    timeline["transfers"].append({"kind": "weights", "bytes": 1, "seconds": 1})  # no `same_node`
    timeline["nodes"].append({"address": "10.0.0.9"})  # no node id
    file.write_text(json.dumps(timeline))
    run = load_run(path)
    read = run.timelines[1]
    assert [(n.address, n.driver) for n in read.nodes] == [("10.0.0.1", True), ("10.0.0.2", False)]
    assert len(read.transfers) == len(timeline["transfers"]) - 1
    assert {f.node for f in read.functions} == {n.node for n in read.nodes}
    assert "timeline step 1: 1 unreadable `nodes` record(s); skipped" in run.problems
    assert "timeline step 1: 1 unreadable `transfers` record(s); skipped" in run.problems
