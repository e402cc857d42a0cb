"""Forecasts users can trust: what the planner's inputs learn from a run, and the forecasts a run
records beside what it measured."""

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from rlhfless.cli import main
from rlhfless.config import load_config
from rlhfless.data import load_prompts
from rlhfless.data.prompts import Prompt
from rlhfless.engine import SamplingParams
from rlhfless.models import load_model, load_tokenizer
from rlhfless.planner.billing import Billing
from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.forecast import (
    CPU_SERIAL_SHARE,
    NOISE,
    SPREAD,
    Calibration,
    LearnerWait,
    PhaseModel,
    Shortfall,
    relative_error,
)
from rlhfless.planner.placement import ClusterSpec
from rlhfless.planner.plan import plan_step
from rlhfless.planner.predictor import LengthPredictor
from rlhfless.planner.pricing import Pricing
from rlhfless.planner.profile import Profile
from rlhfless.planner.replay import replay_times
from rlhfless.planner.scaling import PlanError
from rlhfless.planner.source_lengths import ANSWER_GROUPS
from rlhfless.planner.step_plan import PromptSpec
from rlhfless.runtime import run_forecast
from rlhfless.runtime.executor import build_engine
from rlhfless.runtime.machine import Speed, memory_path
from rlhfless.runtime.planning import StepPlanner, build_planner
from rlhfless.runtime.run_forecast import forecast_for_config, length_pilot
from rlhfless.runtime.samples import Sample, StepPrompt
from rlhfless.runtime.trainer import answer_lengths, tokenize_prompts, train
from rlhfless.runtime.validation import Decoded
from rlhfless.runtime.validation_functions import FunctionsDecode


def flat_profile(step_ms: float = 10.0) -> Profile:
    return Profile(
        prefill_tokens=np.array([1.0, 1000.0]),
        prefill_ms=np.array([0.0, 0.0]),
        decode_batch=np.array([1.0, 1000.0]),
        decode_context=np.array([0.0, 1e4]),
        decode_ms=np.full((2, 2), step_ms),
    )


def test_an_unseen_prompt_takes_its_sources_lengths_and_its_answer_only_where_answers_fit():
    p = LengthPredictor(default_length=256)
    # "solution": each group's mean runs 2x its worked answer, its max 2.5x. "arith": answers of
    # 1-3 tokens whose length says nothing of the responses'.
    solution, arith = [f"s{k}" for k in range(ANSWER_GROUPS)], [f"a{k}" for k in range(4)]
    worked = [20 * (k + 1) for k in range(ANSWER_GROUPS)]
    answers = [*worked, 1, 3, 2, 1]
    p.predict(solution + arith, answers, ["solution"] * len(solution) + ["arith"] * 4)  # sources, answers
    lengths = [[1.5 * a, 2.5 * a] for a in worked] + [[60, 40], [30, 50], [70, 90], [20, 40]]
    p.update_many(solution + arith, lengths)
    gmax, gmean = p.predict(
        ["s9", "s10", "a9", "p9"], [100, 10, 3, 5], ["solution", "solution", "arith", "poetry"]
    )
    # the answer times the ratios learned, so the two unseen solutions are told apart
    assert gmax[:2].tolist() == pytest.approx([250.0, 25.0])
    assert gmean[:2].tolist() == pytest.approx([200.0, 20.0])
    # arith: its source's lengths (the median of its group maxima for 1 unseen prompt), not the answer
    assert (gmax[2], gmean[2]) == (np.quantile([60, 50, 90, 40], 0.5), 50.0)
    assert gmax[3] == 256.0  # a source never seen: the default
    restored = LengthPredictor(default_length=256)
    restored.load_state_dict(json.loads(json.dumps(p.state_dict())))
    assert restored.predict(["s9"], [100], ["solution"])[0].tolist() == pytest.approx([250.0])


def test_a_few_groups_cannot_vouch_for_their_sources_answers():
    # A ratio fitted to the one group it is judged on fits perfectly, and two groups, one judging
    # the other, fit by chance (the default run's chain_sum, on its pilot's group and one not at
    # the cap, had its answers stand in and predicted 11 tokens for a group that ran to 160), so a
    # source's answers stand in only once ANSWER_GROUPS groups not at the cap have each judged a
    # ratio learned without them.
    p = LengthPredictor(default_length=256)
    p.predict(["s0"], [40], ["solution"])
    p.update_many(["s0"], [[60, 100]])
    assert p.predict(["s1"], [10], ["solution"])[0].tolist() == [100.0]  # the source's group max
    for k in range(1, ANSWER_GROUPS - 1):  # each judged by the ratio before it (2.0 on the mean): fits
        assert p.predict([f"u{k}"], [30], ["solution"])[1].tolist() != pytest.approx([60.0])
        p.predict([f"s{k}"], [10 * k], ["solution"])
        p.update_many([f"s{k}"], [[15 * k, 25 * k]], cap=160)
    p.predict(["capped"], [30], ["solution"])
    p.update_many(["capped"], [[160, 60]], cap=160)  # at the cap: judges nothing
    assert p.predict(["u"], [30], ["solution"])[1].tolist() != pytest.approx([60.0])
    p.predict(["s9"], [50], ["solution"])
    p.update_many(["s9"], [[75, 125]], cap=160)
    assert p.predict(["u"], [30], ["solution"])[1].tolist() == pytest.approx([60.0])


def test_a_steps_groups_weigh_by_their_share_of_all_seen_so_the_pilots_few_do_not_count_as_much_as_a_step():
    p = LengthPredictor()

    def observe(p, uids, answers, ratio):
        p.predict(uids, answers, ["src"] * len(uids))
        p.update_many(uids, [[ratio * a, ratio * a] for a in answers])

    def learned(p) -> float:  # the answer ratio an unseen prompt of the source is predicted with
        return float(p.predict(["unseen"], [50], ["src"])[1][0]) / 50

    observe(p, ["pilot:a", "pilot:b"], [10, 20], 3.0)  # the length pilot's two groups
    observe(p, [f"q{k}" for k in range(98)], list(range(5, 103)), 2.0)  # the first step's 98
    first = np.exp(0.98 * np.log(2.0) + 0.02 * np.log(3.0))  # log-space EWMA at 98/100, not 1/2
    assert learned(p) == pytest.approx(first)
    resumed = LengthPredictor()
    resumed.load_state_dict(json.loads(json.dumps(p.state_dict())))
    for q in (p, resumed):  # a step as large as all before it weighs SOURCE_ALPHA, resumed or not
        observe(q, [f"r{k}" for k in range(98)], list(range(5, 103)), 4.0)
        assert learned(q) == pytest.approx(np.exp(0.5 * np.log(4.0) + 0.5 * np.log(first)))


def test_a_group_cut_at_the_cap_teaches_no_answer_ratio():
    # Responses run 2x their answers, but the 100-token cap cut the two longest groups: their 100
    # says only "at least 100", and would pull the ratio (and the fit) down.
    p = LengthPredictor(default_length=256)
    uids, answers = [f"s{k}" for k in range(7)], [10, 20, 30, 40, 45, 80, 90]
    p.predict(uids, answers, ["solution"] * 7)
    p.update_many(uids, [[2 * min(a, 50)] * 2 for a in answers], cap=100)
    assert p.predict(["s9"], [25], ["solution"])[1].tolist() == pytest.approx([50.0])


def test_answers_of_one_length_rank_nothing_so_they_never_stand_in():
    # Every answer 1 token (a count), every group within 10% of the others: a scaled answer fits
    # within 25%, but only as well as the source's one length, so the source's lengths stay.
    p = LengthPredictor(default_length=256)
    uids = [f"q{k}" for k in range(6)]
    p.predict(uids, [1] * 6, ["count"] * 6)
    p.update_many(uids, [[50, 60], [55, 65], [60, 70], [52, 62], [58, 68], [54, 64]])
    assert p.predict(["q9"], [1], ["count"])[0].tolist() == [np.quantile([60, 65, 70, 62, 68, 64], 0.5)]


def test_an_unseen_prompts_mean_follows_its_sources_recent_steps():
    # Responses lengthen as the policy trains: three steps at a mean of 40, one at 80. A mean over
    # every group seen (50) lags; the source's EWMA over steps (weight 0.5) is at 60.
    p = LengthPredictor(default_length=256)
    for step, mean in enumerate((40, 40, 40, 80)):
        uids = [f"s{step}-{k}" for k in range(2)]
        p.predict(uids, None, ["arith"] * 2)
        p.update_many(uids, [[mean - 10, mean + 10]] * 2)
    new = [f"new-{k}" for k in range(4)]
    gmax, gmean = p.predict(new, None, ["arith"] * 4)
    assert gmean.tolist() == pytest.approx([60.0] * 4)
    # the group max: the maxima's quantile that the longest of 4 unseen prompts reaches (4/5)
    assert gmax.tolist() == pytest.approx([np.quantile([50.0] * 6 + [90.0] * 2, 0.8)] * 4)
    restored = LengthPredictor(default_length=256)
    restored.load_state_dict(json.loads(json.dumps(p.state_dict())))
    assert restored.predict(new, None, ["arith"] * 4)[1].tolist() == pytest.approx([60.0] * 4)


def test_calibration_learns_the_time_model_error_apart_from_the_length_error():
    cal = Calibration()
    cal.observe(measured_busy_s=30.0, model_busy_s=10.0, measured_s=40.0, model_s=10.0)
    assert cal.decode_scale == 3.0 and cal.overhead_s == pytest.approx(10.0)
    scaled = cal.profile(flat_profile(10.0))
    assert float(scaled.decode_step_seconds(4, 100)) == pytest.approx(0.03)
    cal.observe(measured_busy_s=10.0, model_busy_s=10.0, measured_s=10.0, model_s=10.0)
    assert cal.decode_scale == pytest.approx(2.0)  # an EWMA: it follows a changing machine
    phases = PhaseModel()
    phases.observe(tokens=1000, seconds=5.0)
    assert phases.per_token_s == 0.005


def test_a_cold_start_is_no_overhead_for_the_warm_steps_after_it():
    cal = Calibration()
    # the first step: 10 s of decode as modelled, behind a 14 s cold start, and 1 s of overhead
    cal.observe(measured_busy_s=10.0, model_busy_s=10.0, measured_s=25.0, model_s=10.0, cold_s=14.0)
    assert cal.overhead_s == pytest.approx(1.0)  # the start is priced apart (cold_start_s)
    cal.observe(measured_busy_s=10.0, model_busy_s=10.0, measured_s=25.0, model_s=10.0)
    assert cal.overhead_s == pytest.approx(8.0)  # a warm step that waits as long: overhead


def test_the_first_step_waits_the_rest_of_the_learners_decode_function_start_as_measured_from_its_prestart():
    cal, base = Calibration(), replace(flat_profile(), cold_start_s=3.0)
    assert cal.host_wait(base, None) == 0.0  # started: nothing to wait for
    assert cal.host_wait(base, 1.0) == 2.0  # nothing measured: a cold start's, less what has run
    cal.observe_cold_start(4.0)
    assert cal.host_wait(base, 0.0) == 4.0  # none started yet: a whole (measured) start
    # Started beside the pilot and the forecast, it took 9 s from its pre-start: that is the start.
    cal.observe_host_start(9.0)
    assert cal.host_wait(base, 6.0) == 3.0 and cal.host_wait(base, 12.0) == 0.0
    again = Calibration()
    again.load_state_dict(json.loads(json.dumps(cal.state_dict())))
    assert again == cal


def test_replay_times_the_plans_actors_at_their_observed_lengths():
    predictor = LengthPredictor()
    prompts = [PromptSpec(f"p{i}", [1, 2, 3], None) for i in range(4)]
    plan = plan_step(prompts, predictor, flat_profile(), _cluster(), _one_actor(), 2)
    busy, total = replay_times(
        plan, {f"p{i}": [10, 30] for i in range(4)}, {f"p{i}": 3 for i in range(4)}, flat_profile()
    )
    assert busy.tolist() == pytest.approx([30 * 0.010])  # the longest sequence's 30 steps of 10 ms
    assert total[0] >= busy[0]
    assert relative_error(12.0, 10.0) == pytest.approx(0.2)


def test_the_shortfall_starts_where_it_was_measured_then_weighs_each_steps_prompts_against_none():
    """Before a quotient, 1 + SPREAD / 2; then steps after the first, each weighted by its prompts,
    against NOISE^2 / SPREAD^2 prompts' worth of 1: a few noisy steps of 8 prompts move the cap a
    little, 512-prompt steps nearly all the way; below 1 where the plans' forecasts fell less short."""
    prior = (NOISE / SPREAD) ** 2
    small, large = Shortfall(), Shortfall()
    # Nothing measured yet (the first step is left out): the middle of where it has been measured.
    small.observe((1.0, 2.0), 8)
    assert Shortfall().factor() == small.factor() == 1 + SPREAD / 2
    large.observe((1.0, 2.0), 8)
    for versus in ((1.0, 1.06), (0.5, 0.53)):
        small.observe(versus, 8)
        large.observe(versus, 512)
    assert small.factor() == pytest.approx(1 + 16 * 0.06 / (16 + prior))
    assert large.factor() == pytest.approx(1 + 1024 * 0.06 / (1024 + prior))
    assert small.factor() < 1.01 < 1.05 < large.factor() < 1.06
    falls_long = Shortfall()
    for versus in ((1.0, 1.0), (1.0, 0.9), None):
        falls_long.observe(versus, 512)
    # verl's forecast fell further short (ours were too long): the cap rises above verl's
    assert falls_long.factor() == pytest.approx(1 - 512 * 0.1 / (512 + prior))
    # A split's against a single size's trusts the forecast until it measured one, the first step's too.
    splits = Shortfall(unknown=1.0, first=True)
    assert splits.factor() == 1.0
    splits.observe((1.0, 1.2), 512)
    assert splits.factor() == pytest.approx(1 + 512 * 0.2 / (512 + prior))
    resumed = Shortfall(unknown=1.0, first=True)  # a resumed run keeps what it learned
    resumed.load_state_dict(json.loads(json.dumps(splits.state_dict())))
    assert resumed.factor() == splits.factor()
    assert set(splits.state_dict()) == {"quotients", "prompts", "steps"}  # not how it was made


def _cluster():

    return ClusterSpec(nodes=1, gpus_per_node=1)


def _one_actor():

    return SchedulerConfig(dedup_prefill=False)


def test_plan_run_forecasts_the_whole_run_without_training(capsys):
    code = main(["plan", "--run", "tiny", "trainer.steps=3", "--pilot", "1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["steps"] == 3 and [r["step"] for r in out["per_step"]] == [1, 2, 3]
    assert out["time_range_s"][0] <= out["time_s"] <= out["time_range_s"][1]
    assert out["cost_range"][0] <= out["cost"] <= out["cost_range"][1]
    for r in out["per_step"]:  # each end re-plans the step, and may take another N: still around it
        assert r["time_range"][0] <= r["time"] <= r["time_range"][1]
        assert r["cost_range"][0] <= r["cost"] <= r["cost_range"][1]
    assert out["time_s"] == pytest.approx(sum(r["time"] for r in out["per_step"]))
    assert out["time_range_s"][0] == pytest.approx(sum(r["time_range"][0] for r in out["per_step"]))
    assert "machine speed x" in out["range"]  # the ends vary the machine's speed too
    assert out["pilot/prompts"] > 0 and out["learning_seconds_per_token"] > 0
    assert out["machine/speed"] > 0 and min(out["machine/probe_ms"]) > 0  # the cached figures' scale
    # For a person: the total, then one row per step (the pilot's lengths now come from the cache).
    assert main(["plan", "--run", "tiny", "trainer.steps=3", "--pilot", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("forecast for 3 step(s): ") and "not measured" in lines[0]
    assert any(line.startswith("machine speed: the cached time figures x ") for line in lines)
    assert any(line.startswith("time model: ") for line in lines)
    steps = [line.split() for line in lines if line.split()[0] in ("1", "2", "3")]
    assert [(int(r[0]), int(r[4])) for r in steps] == [(r["step"], r["n_actors"]) for r in out["per_step"]]


def test_the_whole_run_range_scales_each_steps_ends_by_the_machines_speed(capsys, monkeypatch):
    """Each step's range, re-planned at its ends' lengths, is then scaled by how far the machine's
    speed may stray (`speed_range`); the point forecast is not."""
    argv = ["plan", "--run", "tiny", "trainer.steps=2", "runtime.speed_probe=false", "--pilot", "0", "--json"]
    forecasts = []
    for factors in ((1.0, 1.0, "as measured"), (0.5, 3.0, "machine speed x0.5 .. x3")):
        monkeypatch.setattr(run_forecast, "speed_range", lambda scales, drift, f=factors: f)
        assert main(argv) == 0
        forecasts.append(json.loads(capsys.readouterr().out))
    plain, scaled = forecasts
    assert scaled["time_s"] == plain["time_s"] and scaled["range"].endswith("; machine speed x0.5 .. x3")
    for key in ("time_range", "cost_range"):
        for p, q in zip(plain["per_step"], scaled["per_step"], strict=True):
            assert q[key] == pytest.approx([p[key][0] * 0.5, p[key][1] * 3.0])
    assert scaled["time_range_s"] == pytest.approx(
        [plain["time_range_s"][0] * 0.5, plain["time_range_s"][1] * 3.0]
    )


def test_plan_run_of_a_validation_alone_is_one_line_and_exit_2(capsys):
    """`validation.only` trains nothing: a forecast of its steps would price steps that never run."""
    assert main(["plan", "--run", "--preset", "tiny", "validation.only=true"]) == 2
    err = capsys.readouterr().err
    assert "validation.only: got true, expected false" in err and len(err.strip().splitlines()) == 1


def test_plan_run_takes_a_preset_as_train_does(capsys):
    """`rlhfless train --preset tiny ...` forecasts with `train` changed to `plan --run`."""
    same = ("trainer.steps=2", "runtime.speed_probe=false", "--pilot", "0", "--json")
    forecasts = []
    for argv in (["--run", "--preset", "tiny"], ["--run", "tiny"]):
        assert main(["plan", *argv, *same]) == 0
        forecasts.append(json.loads(capsys.readouterr().out))
    assert forecasts[0]["steps"] == 2 and forecasts[0]["time_s"] == forecasts[1]["time_s"]


def test_a_second_forecast_of_the_same_model_prompts_and_settings_takes_the_pilots_lengths_from_the_cache(
    tmp_path,
):

    # The table as cached (no speed probe): the same lengths give the same forecast.
    cfg = _tiny(
        tmp_path,
        "scheduler.length_pilot=1",
        f"model.cache_dir={tmp_path / 'cache'}",
        "runtime.speed_probe=false",
    )
    first, second = forecast_for_config(cfg), forecast_for_config(cfg)
    assert first["pilot/cached"] == 0 and first["pilot/seconds"] > 0 and first["pilot/cost"] > 0
    assert second["pilot/cached"] == 1 and second["pilot/seconds"] == 0 and second["pilot/cost"] == 0
    assert second["per_step"] == first["per_step"]  # the same lengths: the same forecast
    assert "guessed" not in first["range"]  # every source was sampled
    other = forecast_for_config(
        _tiny(tmp_path, "scheduler.length_pilot=1", f"model.cache_dir={tmp_path / 'cache'}", "seed=1")
    )
    assert other["pilot/cached"] == 0  # another seed samples again


def test_the_pilot_tells_its_prompts_answers_so_that_two_prompts_of_a_source_can_judge_them(tmp_path):

    cfg = _tiny(tmp_path, f"model.cache_dir={tmp_path / 'cache'}")
    tokenizer = load_tokenizer(cfg.model)
    engine = build_engine(cfg, load_model(cfg.model, len(tokenizer), cfg.seed), tokenizer)
    prompts = tokenize_prompts(load_prompts(cfg.data), tokenizer, cfg.generation.max_prompt_tokens)
    told: list[list[str]] = []

    def answers(batch):
        told.append([p.uid for p in batch])
        return answer_lengths(batch, tokenizer)

    sources = [p.prompt.data_source for p in prompts]
    judged = {s for s in sources if sources.count(s) >= 2}
    assert judged  # the tiny data has sources of two prompts or more
    for per_source, expected in ((1, set()), (2, judged)):
        predictor = LengthPredictor()
        out = length_pilot(engine, prompts, cfg, per_source, predictor, answers)
        assert len(told[-1]) == out["pilot/prompts"]  # the pilot's own prompts, and only those
        # One group per source has nothing to be judged by; two judge each other.
        assert set(predictor.sources.answer_errors()) == expected


def test_a_run_records_its_forecast_before_step_1_and_each_steps_forecast_beside_the_measured(tmp_path):
    cfg = load_config(
        preset="tiny",
        overrides=(
            f"output_dir={tmp_path}",
            "trainer.steps=3",
            "trainer.progress=false",
            "trainer.tensorboard=false",
            "scheduler.length_pilot=1",
        ),
    )
    result = train(cfg)
    forecast = json.loads((tmp_path / "forecast.json").read_text())
    assert [r["step"] for r in forecast["per_step"]] == [1, 2, 3]
    for row in result.history:
        assert row["forecast/generation_time"] == row["plan/predicted_time"]
        assert row["forecast/error/generation_time"] == pytest.approx(
            row["forecast/generation_time"] / row["time/generation"] - 1
        )
        assert row["forecast/step_time"] >= row["forecast/generation_time"]
        # ...and the floor of its true lengths, with the measured generation over it.
        assert row["floor/generation_s"] == max(row["floor/latency_s"], row["floor/throughput_s"]) > 0
        assert row["floor/time_over"] == pytest.approx(row["time/generation"] / row["floor/generation_s"])
        if "cost/generation" in row:
            assert row["floor/cost_over"] == pytest.approx(row["cost/generation"] / row["floor/work_cost"])
    assert result.history[-1]["calibration/after_s_per_token"] > 0


def test_an_infeasible_budget_stops_the_run_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--preset", "tiny", f"output_dir={out}", "scheduler.budget_per_step=1e-12"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "scheduler.budget_per_step: got 1e-12 $, expected at least the cheapest plan's forecast" in err[0]
    assert "even at the forecast's optimistic end" in err[0]
    assert not out.exists()


def _tiny(tmp_path, *extra: str):
    return load_config(
        preset="tiny",
        overrides=(
            f"output_dir={tmp_path / 'run'}",
            "trainer.steps=3",
            "trainer.progress=false",
            "trainer.tensorboard=false",
            # the forecast below and the run's plan alike: neither remembers, nor probes the speed
            "runtime.calibration_memory=false",
            "runtime.speed_probe=false",
            *extra,
        ),
    )


@pytest.mark.parametrize(("key", "index"), [("deadline_per_step", "time"), ("budget_per_step", "cost")])
def test_a_target_only_the_point_forecast_misses_is_refused_before_the_run_only_if_the_optimistic_end_misses_it(
    tmp_path, key, index
):

    rows = forecast_for_config(_tiny(tmp_path))["per_step"]
    # The tiny run has one slot: each step's plan is its only one, the fastest and the cheapest.
    low = max(r[f"{index}_range"][0] for r in rows)
    assert low < rows[0][index]  # no pilot: a guessed length's optimistic end is one token
    between = (low + rows[0][index]) / 2
    forecast = forecast_for_config(_tiny(tmp_path, f"scheduler.{key}={between}"))
    assert 1 in forecast["target_missed_steps"]
    assert forecast["target_missed_steps"] == [r["step"] for r in rows if r[index] > between]
    assert (
        forecast["warning"].startswith(f"scheduler.{key}={between:.6g}") and "\n" not in forecast["warning"]
    )
    assert forecast["per_step"][0][index] == pytest.approx(rows[0][index])  # the plan nearest to it
    with pytest.raises(PlanError, match=f"{key}: got .* even at the forecast's optimistic end"):
        forecast_for_config(_tiny(tmp_path, f"scheduler.{key}={low * 0.99}"))


def train_under_a_deadline_the_point_forecast_misses(tmp_path, capsys, *extra: str):
    """`rlhfless train` of 3 tiny steps under a deadline between the forecast's optimistic end and
    its point forecast of step 1: (exit code, stderr lines, run directory, deadline)."""

    rows = forecast_for_config(_tiny(tmp_path))["per_step"]
    deadline = (max(r["time_range"][0] for r in rows) + rows[0]["time"]) / 2
    out = tmp_path / "run"
    overrides = [
        "trainer.steps=3",
        "runtime.calibration_memory=false",
        "runtime.speed_probe=false",
        f"scheduler.deadline_per_step={deadline}",
    ]
    code = main(["train", "--preset", "tiny", f"output_dir={out}", *overrides, *extra])
    return code, capsys.readouterr().err.strip().splitlines(), out, deadline


def test_a_run_whose_target_only_the_point_forecast_misses_starts_and_its_steps_planner_decides(
    tmp_path, capsys
):
    code, err, out, _ = train_under_a_deadline_the_point_forecast_misses(tmp_path, capsys)
    assert err[0].startswith("rlhfless: warning: scheduler.deadline_per_step=") and "early steps" in err[0]
    assert json.loads((out / "forecast.json").read_text())["target_missed_steps"][0] == 1
    # The run started; step 1 plans on what the forecast had (no step measured yet) and refuses.
    assert code == 2 and len(err) == 2
    assert err[1].startswith("rlhfless: step 1: scheduler.deadline_per_step: got")


def test_a_run_asked_to_take_the_nearest_plan_goes_on_past_a_missed_target_saying_so_each_step(
    tmp_path, capsys
):
    code, err, out, deadline = train_under_a_deadline_the_point_forecast_misses(
        tmp_path, capsys, "trainer.progress=false", "scheduler.target_miss=nearest"
    )
    assert code == 0 and "takes the plan nearest to it" in err[0]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 3 and metrics[0]["target/missed"] == 1.0
    missed = [m["step"] for m in metrics if m["target/missed"]]
    warned = [line.split(": ")[1:3] for line in err[1:]]  # one line a missed step
    assert warned == [["warning", "scheduler.deadline_per_step"]] * len(missed)
    for step, line in zip(missed, err[1:], strict=True):
        m = metrics[step - 1]
        assert f"got {deadline:.6g} s, expected at least the fastest plan's forecast" in line
        assert line.endswith(f"(N={m['plan/n_actors']:.0f}); step {step} takes that plan")
        assert m["forecast/step_time"] > deadline and m["target/deadline_per_step"] == deadline


def train_tiny(tmp_path, name: str, *extra: str) -> list[dict]:
    """Two tiny steps in `tmp_path / name`, the time model's memory in `tmp_path / "cache"`."""
    cfg = load_config(
        preset="tiny",
        overrides=(
            f"output_dir={tmp_path / name}",
            f"model.cache_dir={tmp_path / 'cache'}",
            "trainer.steps=2",
            "trainer.progress=false",
            "trainer.tensorboard=false",
            *extra,
        ),
    )
    return train(cfg).history


def test_a_new_run_starts_its_time_model_from_what_earlier_runs_on_this_machine_learned(tmp_path):
    first = train_tiny(tmp_path, "a")
    [memory] = (tmp_path / "cache" / "profiles").glob("calibration-*.json")
    learned = json.loads(memory.read_text())["calibration"]
    assert learned["decode_scale"] == pytest.approx(first[-1]["calibration/decode_scale"])
    forgetful = train_tiny(tmp_path, "b", "runtime.calibration_memory=false")
    remembering = train_tiny(tmp_path, "c")
    # Its plans use the scale the earlier runs learned, which its first step leaves as it was.
    assert remembering[0]["calibration/decode_scale"] != forgetful[0]["calibration/decode_scale"]
    # ... and its forecast before step 1 says what it rests on.
    steps = {run: json.loads((tmp_path / run / "forecast.json").read_text())["memory/steps"] for run in "abc"}
    assert steps == {"a": 0, "b": 0, "c": len(first)}
    runs = {run: json.loads((tmp_path / run / "forecast.json").read_text())["memory/runs"] for run in "abc"}
    assert runs == {"a": 0, "b": 0, "c": 1}  # whose decode scales the memory weighs


def test_a_runs_first_step_teaches_the_time_model_only_where_no_earlier_run_has(tmp_path):
    """A first step pays once for first touches (and its learning phase for its ranks' start):
    what earlier runs' steps taught is kept through it, but for the decode scale, which its decode
    ratio over how far earlier runs' first steps ran over says; a run with nothing learned yet
    (the learning rate primed on a synthetic batch alone) learns from it."""
    fresh = train_tiny(tmp_path, "fresh")
    primed = json.loads((tmp_path / "fresh" / "forecast.json").read_text())["learning_seconds_per_token"]
    assert fresh[0]["calibration/after_s_per_token"] != pytest.approx(primed)
    assert fresh[0]["calibration/decode_scale"] != 1.0  # nothing learned before: step 1 teaches it
    [memory] = (tmp_path / "cache" / "profiles").glob("calibration-*.json")
    remembered = json.loads(memory.read_text())
    later = train_tiny(tmp_path, "later")
    # Its seconds scaled to the machine's speed now; the decode scale is a ratio to the table.
    now = json.loads((tmp_path / "later" / "forecast.json").read_text())["machine/probe_ms"]
    slower = Speed(tuple(now), tuple(now)).since(remembered["probe_ms"])
    [excess] = remembered["first_excess"]
    assert excess == pytest.approx(fresh[0]["calibration/first_ratio"] / fresh[1]["calibration/decode_scale"])
    for key, learned in (
        ("after_s_per_token", remembered["phases"]["per_token_s"] * slower),
        ("decode_scale", later[0]["calibration/first_ratio"] / excess),
    ):
        assert later[0][f"calibration/{key}"] == pytest.approx(learned), key
        assert later[1][f"calibration/{key}"] != pytest.approx(learned), key


def test_earlier_runs_time_model_is_kept_per_learning_width_and_policy(tmp_path):
    """The phases after generation are learned in seconds a token at the width they ran on: a run
    learning on one slot is not forecast with the rate two ranks taught (nor the other way)."""

    def where(*extra: str):
        cfg = load_config(
            preset="tiny",
            overrides=("runtime.executor=ray", "runtime.num_cpus=2", f"model.cache_dir={tmp_path}", *extra),
        )
        return memory_path(cfg, load_model(cfg.model, len(load_tokenizer(cfg.model)), cfg.seed))

    planners = where("runtime.learner_width=0")  # both slots free: the planner's width is 2
    assert planners == where("runtime.learner_width=2")
    assert where("runtime.learner_width=1") != planners
    assert where("scheduler.policy=verl") != planners  # its functions share the machine otherwise
    assert where("runtime.calibration_memory=false") is None
    # The config's threads, not the process's: `train` builds its planner before the Ray executor
    # sets the driver's threads, `plan --run` after, and both read one memory.
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if before > 1 else 2)
        assert where("runtime.learner_width=0") == planners
    finally:
        torch.set_num_threads(before)
    assert where("trainer.threads=3") != planners


def test_a_learning_phase_waits_a_ranks_start_where_the_decode_functions_hold_the_slots_it_needs():
    wait = LearnerWait()
    # Two slots, nothing seen: one function leaves a slot for rank 1; two hold both to the end.
    assert wait.seconds(2, start_s=5.0) == (0.0, 5.0)
    wait.observe(1, width=2, wait_s=0.4)
    assert wait.seconds(2, start_s=5.0) == (0.4, 5.0)
    wait.observe(2, width=2, wait_s=7.0)
    wait.observe(2, width=2, wait_s=6.0)
    assert wait.seconds(2, start_s=5.0) == (0.4, 6.5)  # learned per N, by EWMA
    # Four slots, the last phase two ranks wide: N = 1..3 leave rank 1 a slot, N = 4 does not.
    assert LearnerWait({1: 0.2, 2: 0.6}, width=2).seconds(4, start_s=5.0) == (0.2, 0.6, 0.4, 5.0)
    assert LearnerWait(width=1).seconds(2, start_s=5.0) == (0.0, 0.0)  # one rank: nothing to wait for
    again = LearnerWait()
    again.load_state_dict(json.loads(json.dumps(wait.state_dict())))
    assert again == wait


def test_the_runtime_planner_learns_the_learners_wait_by_n_apart_from_the_rate_after_generation():

    planner = StepPlanner(SchedulerConfig(), flat_profile(), ClusterSpec(1, 2), 2, resident_units=1.0)
    prompts = [StepPrompt(Prompt(f"p{i}", [], None, "src"), "", [1, 2, 3 + i]) for i in range(4)]
    samples = [Sample(p.uid, k, p.prompt_ids, [7] * 5, "stop") for p in prompts for k in range(2)]
    tokens = 8 * (3 + 5)
    for wait in (6.0, 8.0):
        plan = planner.plan(prompts, [None] * 4, LengthPredictor())
        plan.n_actors = 2  # two decode functions on two slots: rank 1 started after generation
        metrics = {"time/step": 40.0 + wait, "time/generation": 20.0, "time/learner_start": wait}
        metrics |= {"learner/width": 2.0, "cost/step": 0.01}
        planner.observe(plan, samples, metrics)
    assert planner.waits.waits == {2: 7.0}
    assert planner.phases.per_token_s == pytest.approx(20.0 / tokens)  # the wait left out
    billing = planner.billing(0, ClusterSpec(1, 2), flat_profile())
    assert billing.learner_wait_s == (0.0, 7.0)
    restored = StepPlanner(SchedulerConfig(), flat_profile(), ClusterSpec(1, 2), 2)
    restored.load_state_dict(planner.state_dict())
    assert restored.waits == planner.waits


def test_a_runs_first_phase_on_a_free_slot_teaches_no_wait_so_one_function_stays_a_choice():
    """`bench_runtime`, session 46: step 1 at N = 1 requested rank 1 only at generation's end
    (its start unmeasured) and waited 5.2 s; kept as N = 1's wait, it put N = 1 past verl's cap
    on every later step, so N = 2 was taken, and its rank waited its whole start each step. N = 2
    exposes the wait on two slots; a first phase there still teaches it."""

    prompts = [StepPrompt(Prompt(f"p{i}", [], None, "src"), "", [1, 2, 3 + i]) for i in range(4)]
    samples = [Sample(p.uid, k, p.prompt_ids, [7] * 5, "stop") for p in prompts for k in range(2)]

    def run(steps: list[tuple[int, float]]) -> StepPlanner:
        planner = StepPlanner(SchedulerConfig(), flat_profile(), ClusterSpec(1, 2), 2, resident_units=1.0)
        for n, wait in steps:
            plan = planner.plan(prompts, [None] * 4, LengthPredictor(), first=not planner.observed)
            plan.n_actors = n
            metrics = {"time/step": 40.0 + wait, "time/generation": 20.0, "time/learner_start": wait}
            metrics |= {"time/rank_start": 6.5}
            planner.observe(plan, samples, metrics | {"learner/width": 2.0, "cost/step": 0.01})
        return planner

    assert run([(1, 5.2)]).waits.waits == {}
    assert run([(1, 5.2), (1, 0.01)]).waits.waits == {1: 0.01}
    assert run([(2, 6.5)]).waits.waits == {2: 6.5}
    # N = 2 not seen yet waits a rank's start as measured, not a decode function's cold start.
    assert flat_profile().cold_start_s != 6.5
    assert run([(1, 5.2)]).billing(0, ClusterSpec(1, 2), flat_profile()).learner_wait_s == (0.0, 6.5)


def test_a_fresh_runs_first_step_teaches_the_time_model_only_until_the_next_step_replaces_it():
    """With nothing learned before, step 1's figures (first touches: a verl step 1 prefilled in
    32.6 s against 12-14 s later) stand in for one step; step 2's replace them, then steps blend."""

    planner = StepPlanner(SchedulerConfig(), flat_profile(), ClusterSpec(1, 2), 2, resident_units=1.0)
    prompts = [StepPrompt(Prompt(f"p{i}", [], None, "src"), "", [1, 2, 3 + i]) for i in range(4)]
    samples = [Sample(p.uid, k, p.prompt_ids, [7] * 5, "stop") for p in prompts for k in range(2)]
    tokens = 8 * (3 + 5)
    scales, rates = [], []
    for busy, after in ((9.0, 30.0), (3.0, 20.0), (6.0, 10.0)):
        plan = planner.plan(prompts, [None] * 4, LengthPredictor())
        metrics = {"time/step": 20.0 + after, "time/generation": 20.0, "time/decode": busy}
        planner.observe(plan, samples, metrics)
        scales.append(planner.calibration.decode_scale)
        rates.append(planner.phases.per_token_s)
    assert scales[1] == pytest.approx(scales[0] / 3)  # replaced: 3 s of busy against 9 s
    assert scales[2] == pytest.approx((scales[1] + 2 * scales[1]) / 2)  # then an EWMA
    assert rates == pytest.approx([30.0 / tokens, 20.0 / tokens, 15.0 / tokens])
    restored = StepPlanner(SchedulerConfig(), flat_profile(), ClusterSpec(1, 2), 2)
    restored.load_state_dict(planner.state_dict())
    assert restored.calibration == planner.calibration and restored.phases == planner.phases


def test_a_learner_ranks_start_is_learned_and_kept_for_a_later_runs_first_phase():
    """Before any was measured a function's cold start stands in; a rank's (its optimizer, its
    take of the published weights) was 10 s against a 4.6 s cold start in a session-29 step 1, so
    that phase waited 6 s. A measured start is what the next run's first phase expects."""
    cal, base = Calibration(), replace(flat_profile(), cold_start_s=3.0)
    assert cal.rank_start(base) == 3.0
    cal.observe_cold_start(4.6)
    assert cal.rank_start(base) == 4.6
    cal.observe_rank_start(10.0)
    cal.observe_rank_start(9.0)
    assert cal.rank_start(base) == pytest.approx(9.5)
    again = Calibration()
    again.load_state_dict(json.loads(json.dumps(cal.state_dict())))
    assert again == cal


def test_the_runtime_planner_prices_and_hands_on_the_rank_start_its_phases_measured():

    base = replace(flat_profile(), cold_start_s=4.0)
    planner = StepPlanner(SchedulerConfig(), base, ClusterSpec(1, 2), 2, resident_units=1.0)
    prompts = [StepPrompt(Prompt(f"p{i}", [], None, "src"), "", [1, 2, 3 + i]) for i in range(4)]
    samples = [Sample(p.uid, k, p.prompt_ids, [7] * 5, "stop") for p in prompts for k in range(2)]
    plan = planner.plan(prompts, [None] * 4, LengthPredictor())
    assert plan.rank_start_s == 4.0  # nothing measured: a function's cold start
    metrics = {"time/step": 40.0, "time/generation": 20.0, "time/learner_start": 0.0}
    metrics |= {"learner/width": 2.0, "cost/step": 0.01, "time/rank_start": 10.0}
    planner.observe(plan, samples, metrics)
    assert planner.billing(0, ClusterSpec(1, 2), base).rank_start_s == 10.0
    assert planner.plan(prompts, [None] * 4, LengthPredictor()).rank_start_s == 10.0
    later = StepPlanner(SchedulerConfig(), base, ClusterSpec(1, 2), 2, resident_units=1.0)
    later.load_state_dict(planner.state_dict())  # what the run memory carries to the next run
    assert later.plan(prompts, [None] * 4, LengthPredictor()).rank_start_s == 10.0
    verl = StepPlanner(SchedulerConfig(policy="verl"), base, ClusterSpec(1, 2), 2, resident_units=1.0)
    assert verl.plan(prompts, [None] * 4, LengthPredictor()).rank_start_s == 0.0  # resident ranks


def test_verls_first_phase_waits_its_resident_ranks_start_and_teaches_the_later_phases_nothing():

    # Nothing seen: the first phase waits a start, at every N; later ones none, at any N.
    assert LearnerWait().seconds(2, start_s=5.0, resident_start=True) == (5.0, 5.0)
    assert LearnerWait().seconds(2, start_s=5.0, resident=True) == (0.0, 0.0)
    verl, cluster = SchedulerConfig(policy="verl"), ClusterSpec(1, 2)
    planner = StepPlanner(verl, flat_profile(), cluster, 2, resident_units=1.0)
    prompts = [StepPrompt(Prompt(f"p{i}", [], None, "src"), "", [1, 2, 3 + i]) for i in range(4)]
    samples = [Sample(p.uid, k, p.prompt_ids, [7] * 5, "stop") for p in prompts for k in range(2)]
    for wait in (5.6, 0.6, 0.6):  # the run's first phase starts the resident ranks
        plan = planner.plan(prompts, [None] * 4, LengthPredictor(), first=not planner.observed)
        plan.n_actors = 2
        metrics = {"time/step": 40.0 + wait, "time/generation": 20.0, "time/learner_start": wait}
        planner.observe(plan, samples, metrics | {"learner/width": 2.0, "cost/step": 0.01})
    assert planner.waits.resident_s == 5.6 and planner.waits.waits == {2: 0.6}
    # Resident ranks wait at any N what they joined in lately, never a start.
    assert planner.billing(0, cluster, flat_profile()).learner_wait_s == (0.6, 0.6)
    assert planner.billing(0, cluster, flat_profile(), first=True).learner_wait_s == (5.6, 5.6)
    # rlhfless starts its ranks every step, each during generation: no first phase of its own.
    rlhfless = StepPlanner(SchedulerConfig(), flat_profile(), cluster, 2, resident_units=1.0)
    rlhfless.load_state_dict(planner.state_dict())
    assert rlhfless.waits == planner.waits
    assert rlhfless.billing(0, cluster, flat_profile(), first=True).learner_wait_s == (0.0, 0.6)


def test_each_learning_width_is_forecast_at_its_own_rate_once_it_has_run():
    # Two ranks measured at 0.05 s a token: one rank is forecast at the same slot-seconds (0.1 s)
    # until it runs; then at what it measured (0.07: two ranks were only 1.4x as fast).
    phases = PhaseModel()
    assert phases.at_width(1, usual=2) is None
    phases.observe(100.0, 5.0, width=2)
    assert phases.at_width(2, usual=2) == pytest.approx(0.05)
    assert phases.at_width(1, usual=2) == pytest.approx(0.1)
    phases.observe(100.0, 7.0, width=1)
    assert phases.at_width(1, usual=2) == pytest.approx(0.07)
    assert phases.at_width(2, usual=2) == pytest.approx(0.05)
    again = PhaseModel()
    again.load_state_dict(json.loads(json.dumps(phases.state_dict())))
    assert again == phases
    # A memory from before widths were apart: its rate stands for the usual width.
    old = PhaseModel()
    old.load_state_dict({"per_token_s": 0.05, "steps": 3})
    assert old.at_width(1, usual=2) == pytest.approx(0.1)


def test_a_width_not_run_yet_is_forecast_by_amdahls_law_with_the_serial_share_measured_on_cpus(tmp_path):
    """On CPU slots two ranks took 0.58-0.70x one rank's time, not 0.5x: 1/W forecast a first
    run's learning 14-27% short (session 54). Once a width has run, its own rate stands."""
    phases = PhaseModel(serial=0.2)
    phases.observe(100.0, 6.0, width=2)  # two ranks: 0.06 s a token
    assert phases.at_width(1, usual=2) == pytest.approx(0.1)  # one rank: 0.06 / 0.6
    assert phases.at_width(4, usual=2) == pytest.approx(0.04)  # four: 0.06 x 0.4 / 0.6
    phases.observe(100.0, 8.0, width=1)
    assert phases.at_width(1, usual=2) == pytest.approx(0.08)
    elastic = StepPlanner(
        SchedulerConfig(), flat_profile(), ClusterSpec(1, 2), 2, resident_units=1.0, learning_units=2.0, widths=2,
        serial=0.2,
    )  # fmt: skip
    elastic.learned_alone(0.004)  # one rank's rate, timed before the run
    assert elastic.phases.per_token_s == pytest.approx(0.0024) == elastic.phases.at_width(2, 2)
    # The run's planner takes the share measured on CPU slots; GPU ranks are not measured yet.
    cfg = load_config(
        preset="tiny",
        overrides=("runtime.executor=ray", "runtime.profile=derived", f"model.cache_dir={tmp_path}"),
    )
    policy = load_model(cfg.model, len(load_tokenizer(cfg.model)), cfg.seed)
    assert build_planner(cfg, policy).phases.serial == CPU_SERIAL_SHARE > 0
    on_gpu = replace(cfg, runtime=replace(cfg.runtime, device="cuda"))
    assert build_planner(on_gpu, policy).phases.serial == 0.0


def test_the_phases_bill_is_learned_apart_where_part_of_their_work_was_hidden():

    phases = PhaseModel()
    phases.observe(100.0, 5.0)  # nothing said of the bill: the step waited on all of it
    assert phases.billed_per_token_s == pytest.approx(0.05)
    phases.observe(100.0, 5.0, billed_s=8.0)  # 3 s of work ran hidden during generation
    assert phases.per_token_s == pytest.approx(0.05) and 0.05 < phases.billed_per_token_s <= 0.08
    again = PhaseModel()
    again.load_state_dict(json.loads(json.dumps(phases.state_dict())))
    assert again == phases
    billing = Billing(Pricing(3600.0), after_units=2.0, after_per_token_s=0.05, after_billed_per_token_s=0.08)
    assert billing.after_generation(100.0) == pytest.approx((5.0, 2 * 8.0))  # waited 5 s, billed 8 s


def test_the_runtime_planner_offers_a_budget_each_learning_width_at_its_rate_and_wait():

    cluster = ClusterSpec(1, 2)
    prompts = [StepPrompt(Prompt(f"p{i}", [], None, "src"), "", [1, 2, 3 + i]) for i in range(4)]
    samples = [Sample(p.uid, k, p.prompt_ids, [7] * 5, "stop") for p in prompts for k in range(2)]
    tokens = 8 * (3 + 5)

    def run(planner: StepPlanner, width: int, after_s: float, wait_s: float):
        plan = planner.plan(prompts, [None] * 4, LengthPredictor())
        metrics = {
            "time/step": 20.0 + after_s + wait_s,
            "time/generation": 20.0,
            "time/learner_start": wait_s,
        }
        planner.observe(plan, samples, metrics | {"learner/width": float(width), "cost/step": 0.01})
        return plan

    fixed = StepPlanner(SchedulerConfig(), flat_profile(), cluster, 2, resident_units=1.0, learning_units=2.0)
    run(fixed, 2, 20.0, 1.0)
    assert fixed.billing(0, cluster, flat_profile()).widths == ()  # the phase's width is not the plan's
    elastic = StepPlanner(
        SchedulerConfig(), flat_profile(), cluster, 2, resident_units=1.0, learning_units=2.0, widths=2
    )
    assert elastic.billing(0, cluster, flat_profile()).widths == ()  # no rate measured yet
    for _ in range(2):  # a run's first phase, on a free slot, teaches no wait (`LearnerWait`)
        run(elastic, 2, 20.0, 1.0)
    one, two = elastic.billing(0, cluster, flat_profile()).widths
    assert (one.width, one.units, one.wait_s, one.rank_start_s) == (1, 1.0, (0.0,), 0.0)
    assert one.per_token_s == pytest.approx(40.0 / tokens)  # two ranks' slot-seconds, on one
    assert (two.width, two.units, two.per_token_s) == (2, 2.0, pytest.approx(20.0 / tokens))
    plan = run(elastic, 1, 28.0, 0.0)  # one rank: 1.4x two ranks' time, no rank to wait for
    assert plan.step_options and plan.learner_width == 0  # lam leaves the width to the phase
    one, two = elastic.billing(0, cluster, flat_profile()).widths
    assert one.per_token_s == pytest.approx(28.0 / tokens) and two.per_token_s == pytest.approx(20.0 / tokens)
    # A plan without a target forecasts the usual width at its own rate, not one mixed with the other's.
    assert elastic.billing(0, cluster, flat_profile()).after_per_token_s == pytest.approx(20.0 / tokens)
    assert elastic.waits.waits == {1: 1.0}  # the one-rank phase taught the two-rank wait nothing


def test_the_rate_one_process_timed_before_the_run_is_one_ranks_and_two_ranks_are_forecast_at_half():
    """`learning_seconds_per_token` times the learning phase in one process. Taken as two ranks'
    own rate, it forecast the default run's learning at twice what two ranks took (whole-run
    forecasts 22-28% long in time and 45-51% in cost, session 51's `bench_runtime`). A width not
    measured yet takes 1/W of the time at W ranks (`PhaseModel.at_width`); a one-slot learner
    keeps the rate as timed."""

    elastic = StepPlanner(
        SchedulerConfig(),
        flat_profile(),
        ClusterSpec(1, 2),
        2,
        resident_units=1.0,
        learning_units=2.0,
        widths=2,
    )
    elastic.learned_alone(0.004)
    assert elastic.phases.at_width(1, 2) == 0.004 and elastic.phases.at_width(2, 2) == pytest.approx(0.002)
    assert elastic.phases.per_token_s == pytest.approx(0.002)
    alone = StepPlanner(SchedulerConfig(), flat_profile(), ClusterSpec(1, 2), 2, resident_units=1.0)
    alone.learned_alone(0.004)
    assert alone.phases.per_token_s == 0.004 and alone.phases.by_width == {}


def test_a_validation_is_planned_for_its_own_responses_with_nothing_after_and_no_step_target():
    """The step's plan prices learning after generation and must meet the step's budget; a
    validation's has no learning after it, so its whole forecast is its generation, and it is
    planned under a budget no step could meet (the budget is the training step's)."""
    prompts = [StepPrompt(Prompt(f"p{i}", [], None, "src"), "", [1, 2, 3 + i]) for i in range(4)]
    scheduler = SchedulerConfig(budget_per_step=1e-12)
    planner = StepPlanner(scheduler, flat_profile(), ClusterSpec(1, 2), 8, resident_units=1.0)
    planner.learned_alone(0.01)
    with pytest.raises(PlanError, match="budget_per_step"):
        planner.plan(prompts, [None] * 4, LengthPredictor())
    plan = planner.plan_validation(prompts, [None] * 4, LengthPredictor(), samples=1)
    assert plan.predicted_step_time == pytest.approx(plan.predicted_time)
    assert plan.predicted_step_cost == pytest.approx(plan.predicted_cost)
    assert sorted(uid for a in plan.actors for uid in a.uids) == [p.uid for p in prompts]
    tokens = [
        sum(
            a.predicted_tokens
            for a in planner.plan_validation(prompts, [None] * 4, LengthPredictor(), n).actors
        )
        for n in (1, 4, 8)
    ]
    assert 0 < tokens[0] < tokens[1] < tokens[2]  # its own responses a prompt, not the step's


def test_a_validation_is_planned_from_the_held_out_lengths_the_last_one_measured():
    """Greedy held-out responses run far from training's sampled lengths; the held-out set is the
    same every time, so the first validation's lengths plan the second (training's predictor
    learns none of them)."""

    class Functions:  # the executor's side of a validation: greedy lengths of 5 + i tokens
        def warm_functions(self):
            return 0

        def cluster(self):
            return ClusterSpec(1, 2)

        def host_starting_s(self):
            return None

        def validate(self, prompts, plan, params, group, stream):
            samples = [
                Sample(p.uid, k, p.prompt_ids, [7] * (5 + i), "stop")
                for i, p in enumerate(prompts)
                for k in range(group)
            ]
            return Decoded(samples, {"cost": 0.0})

    prompts = [StepPrompt(Prompt(f"p{i}", [], None, "src"), "", [1, 2, 3 + i]) for i in range(4)]
    planner = StepPlanner(SchedulerConfig(), flat_profile(), ClusterSpec(1, 2), 8, max_length=64)
    training = LengthPredictor()
    before = json.dumps(training.state_dict())
    decode = FunctionsDecode(Functions(), planner, training, [None] * 4)
    params = SamplingParams(max_new_tokens=64, temperature=0.0)
    first, second = (decode(prompts, params, 1, -2) for _ in range(2))
    greedy = [5 + i for i in range(4)]
    planned = [[done.files["plans"]["predicted_length"][p.uid] for p in prompts] for done in (first, second)]
    assert planned[1] == pytest.approx(greedy)
    assert planned[0] != pytest.approx(greedy)
    assert second.figures["predictor/mae"] < first.figures["predictor/mae"]
    assert json.dumps(training.state_dict()) == before
    # A resumed run's next validation is planned from the lengths its checkpoint kept.
    resumed = FunctionsDecode(Functions(), planner, training, [None] * 4)
    resumed.load_state_dict(json.loads(json.dumps(decode.state_dict())))
    again = resumed(prompts, params, 1, -2).files["plans"]["predicted_length"]
    assert [again[p.uid] for p in prompts] == pytest.approx(greedy)
