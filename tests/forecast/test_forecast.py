"""Forecasts users can trust: what the planner's inputs learn from a run, and the forecasts a run
records beside what it measured."""

import json

import numpy as np
import pytest

from rlhfless.cli import main
from rlhfless.config import load_config
from rlhfless.planner.forecast import Calibration, PhaseModel, relative_error, replay_times
from rlhfless.planner.plan import PromptSpec, plan_step
from rlhfless.planner.predictor import LengthPredictor
from rlhfless.planner.profile import Profile
from rlhfless.runtime.trainer import train


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
    p.predict(["a1", "b1"], [2, 40], ["arith", "essay"])  # tells it sources and answers
    p.update_many(["a1", "b1"], [[60, 40], [44, 36]])  # arith answers 2 tokens: no fit; essay 40: fits
    gmax, gmean = p.predict(["a2", "b2", "c2"], [3, 50, 5], ["arith", "essay", "poetry"])
    assert (gmax[0], gmean[0]) == (60.0, 50.0)  # the source's lengths, not the 3-token answer
    assert gmax[1] == gmean[1] == 50.0  # the answer, since answers fit this source
    assert gmax[2] == 256.0  # a source never seen: the default
    restored = LengthPredictor(default_length=256)
    restored.load_state_dict(json.loads(json.dumps(p.state_dict())))
    assert np.array_equal(restored.predict(["a2"], [3], ["arith"])[0], [60.0])


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


def _cluster():
    from rlhfless.planner.placement import ClusterSpec

    return ClusterSpec(nodes=1, gpus_per_node=1)


def _one_actor():
    from rlhfless.planner.config import SchedulerConfig

    return SchedulerConfig(dedup_prefill=False)


def test_plan_run_forecasts_the_whole_run_without_training(capsys):
    code = main(["plan", "--run", "tiny", "trainer.steps=3", "--pilot", "1"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["steps"] == 3 and [r["step"] for r in out["per_step"]] == [1, 2, 3]
    assert out["time_range_s"][0] <= out["time_s"] <= out["time_range_s"][1]
    assert out["cost_range"][0] <= out["cost"] <= out["cost_range"][1]
    assert out["time_s"] == pytest.approx(sum(r["time"] for r in out["per_step"]))
    assert out["pilot/prompts"] > 0 and out["learning_seconds_per_token"] > 0


def test_a_second_forecast_of_the_same_model_prompts_and_settings_takes_the_pilots_lengths_from_the_cache(
    tmp_path,
):
    from rlhfless.runtime.run_forecast import forecast_for_config

    cfg = _tiny(tmp_path, "scheduler.length_pilot=1", f"model.cache_dir={tmp_path / 'cache'}")
    first, second = forecast_for_config(cfg), forecast_for_config(cfg)
    assert first["pilot/cached"] == 0 and first["pilot/seconds"] > 0 and first["pilot/cost"] > 0
    assert second["pilot/cached"] == 1 and second["pilot/seconds"] == 0 and second["pilot/cost"] == 0
    assert second["per_step"] == first["per_step"]  # the same lengths: the same forecast
    assert "guessed" not in first["range"]  # every source was sampled
    other = forecast_for_config(
        _tiny(tmp_path, "scheduler.length_pilot=1", f"model.cache_dir={tmp_path / 'cache'}", "seed=1")
    )
    assert other["pilot/cached"] == 0  # another seed samples again


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
            "runtime.calibration_memory=false",  # the forecast below and the run's plan alike
            *extra,
        ),
    )


@pytest.mark.parametrize(("key", "index"), [("deadline_per_step", "time"), ("budget_per_step", "cost")])
def test_a_target_only_the_point_forecast_misses_is_refused_before_the_run_only_if_the_optimistic_end_misses_it(
    tmp_path, key, index
):
    from rlhfless.planner.scaling import PlanError
    from rlhfless.runtime.run_forecast import forecast_for_config

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


def test_a_run_whose_target_only_the_point_forecast_misses_starts_and_its_steps_planner_decides(
    tmp_path, capsys
):
    from rlhfless.runtime.run_forecast import forecast_for_config

    rows = forecast_for_config(_tiny(tmp_path))["per_step"]
    deadline = (max(r["time_range"][0] for r in rows) + rows[0]["time"]) / 2
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--preset",
            "tiny",
            f"output_dir={out}",
            "trainer.steps=3",
            "runtime.calibration_memory=false",
            f"scheduler.deadline_per_step={deadline}",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("rlhfless: warning: scheduler.deadline_per_step=") and "early steps" in err[0]
    assert json.loads((out / "forecast.json").read_text())["target_missed_steps"][0] == 1
    # The run started; step 1 plans on what the forecast had (no step measured yet) and refuses.
    assert code == 2 and len(err) == 2
    assert err[1].startswith("rlhfless: step 1: scheduler.deadline_per_step: got")


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
    # Its first step's plan already used the scale the earlier runs learned: one more EWMA update.
    assert remembering[0]["calibration/decode_scale"] != forgetful[0]["calibration/decode_scale"]


def test_a_runs_first_learning_phase_teaches_the_rate_only_where_no_earlier_run_has(tmp_path):
    """A first phase pays once for its ranks' start and first touches: a rate measured on earlier
    runs' steps is kept through it; one primed on a synthetic batch alone learns from it."""
    fresh = train_tiny(tmp_path, "fresh")
    primed = json.loads((tmp_path / "fresh" / "forecast.json").read_text())["learning_seconds_per_token"]
    assert fresh[0]["calibration/after_s_per_token"] != pytest.approx(primed)
    [memory] = (tmp_path / "cache" / "profiles").glob("calibration-*.json")
    remembered = json.loads(memory.read_text())["phases"]["per_token_s"]
    later = train_tiny(tmp_path, "later")
    assert later[0]["calibration/after_s_per_token"] == pytest.approx(remembered)
    assert later[1]["calibration/after_s_per_token"] != pytest.approx(remembered)
