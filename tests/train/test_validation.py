"""Validation: held-out prompts scored between steps, which change nothing that is trained."""

import json

import pytest

from rlhfless.cli import main
from rlhfless.config import load_config
from rlhfless.data import DataConfig, Prompt, load_prompts, load_validation_prompts
from rlhfless.engine import Engine, SamplingParams, rollout
from rlhfless.runtime.samples import Sample, StepPrompt
from rlhfless.runtime.trainer import train
from rlhfless.runtime.validation import shared_prefix, validation_metrics, validation_steps
from tests.engine.engine_support import small_llama

# A reward that varies on a random model's text (it rarely scores on the task): the share of
# characters with an odd code point.
REWARD = (
    "def odd_share(prompt, response):\n    return sum(ord(c) % 2 for c in response) / max(len(response), 1)\n"
)
# Deterministic training quantities (timings, and the forecasts made from them, are not).
COMPARED = ("reward/mean", "response_length/mean", "kl/mean", "loss/policy", "grad_norm")


def tiny(tmp_path, *overrides):
    tmp_path.mkdir(parents=True, exist_ok=True)
    fn = tmp_path / "odd.py"
    fn.write_text(REWARD)
    return load_config(
        preset="tiny",
        overrides=(
            f"output_dir={tmp_path / 'run'}",
            "trainer.progress=false",
            "trainer.tensorboard=false",
            "trainer.threads=1",
            f"reward.function={fn}:odd_share",
            *overrides,
        ),
    )


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def trained(rows):
    return [{k: r[k] for k in COMPARED} for r in rows]


def test_validation_runs_before_training_every_n_steps_and_after_the_last(tmp_path):
    train(tiny(tmp_path, "validation.every=2", "validation.size=6", "trainer.steps=3"))
    run = tmp_path / "run"
    rows = lines(run / "validation.jsonl")
    assert [r["step"] for r in rows] == [0, 2, 3]
    for row in rows:
        assert row["val/prompts"] == 6 and 0 <= row["val/reward/mean"] <= 1
        assert row["time/validation"] > 0
        sources = [k for k in row if k.startswith("val/source/reasoning_gym/")]
        assert sources  # each task's mean reward, VERL's test_score per data source
    records = lines(run / "validation" / "step_000002.jsonl")
    assert len(records) == 6 and {r["step"] for r in records} == {2}
    assert all(r["response"] is not None and r["data_source"].startswith("reasoning_gym/") for r in records)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["first_validation"]["step"] == 0 and summary["last_validation"]["step"] == 3
    assert summary["validation_seconds"] == pytest.approx(sum(r["time/validation"] for r in rows))
    # the trained policy answers differently from the initial one on the held-out prompts
    assert lines(run / "validation" / "step_000000.jsonl") != lines(run / "validation" / "step_000003.jsonl")


@pytest.mark.parametrize(
    "settings, start, steps",
    [
        (("validation.every=2",), 0, [0, 2, 4, 5]),
        (("validation.every=2",), 2, [4, 5]),  # a resumed run: its checkpoint's step was validated
        (("validation.every=2", "validation.before_train=false"), 0, [2, 4, 5]),
        (("validation.every=9",), 0, [0, 5]),
        ((), 0, []),
    ],
)
def test_the_steps_validated_are_every_nth_and_the_last(settings, start, steps, tmp_path):
    assert validation_steps(tiny(tmp_path, "trainer.steps=5", *settings), start) == steps


def test_the_forecast_before_the_run_counts_and_prices_its_validations(tmp_path):
    train(tiny(tmp_path, "validation.every=2", "validation.size=6", "trainer.steps=3"))
    forecast = json.loads((tmp_path / "run" / "forecast.json").read_text())
    assert forecast["validation/count"] == len(lines(tmp_path / "run" / "validation.jsonl")) == 3
    assert forecast["validation/seconds"] > 0 and forecast["validation/cost"] > 0


def test_validation_changes_no_trained_sample_or_number(tmp_path):
    plain = train(tiny(tmp_path / "a", "trainer.steps=3"))
    validated = train(tiny(tmp_path / "b", "trainer.steps=3", "validation.every=1", "validation.samples=2"))
    assert trained(plain.history) == trained(validated.history)
    for step in (1, 2, 3):
        name = f"rollouts/step_{step:06d}.jsonl"
        assert lines(tmp_path / "a" / "run" / name) == lines(tmp_path / "b" / "run" / name)
    # ... nor anything the length predictor keeps (the forecast asked it about held-out prompts)
    states = [
        json.loads(next((tmp_path / run / "run" / "checkpoints").glob("*/trainer_state.json")).read_text())
        for run in ("a", "b")
    ]
    assert states[0]["predictor"] == states[1]["predictor"]


def test_greedy_validation_of_the_same_policy_is_the_same(tmp_path):
    """Step 0 of two runs validates one initial policy: every held-out response is the same."""
    for name in ("a", "b"):
        train(tiny(tmp_path / name, "trainer.steps=1", "validation.every=1", "validation.size=5"))
    first = [lines(tmp_path / n / "run" / "validation" / "step_000000.jsonl") for n in ("a", "b")]
    assert first[0] == first[1]


def test_a_resumed_run_validates_each_step_once(tmp_path):
    args = ("validation.every=1", "validation.size=4")
    train(tiny(tmp_path, "trainer.steps=2", *args))
    train(tiny(tmp_path, "trainer.steps=3", "resume=true", *args))
    assert [r["step"] for r in lines(tmp_path / "run" / "validation.jsonl")] == [0, 1, 2, 3]


def test_held_out_reasoning_gym_prompts_are_never_training_prompts():
    """Easy tasks repeat questions; a held-out one that is also a training prompt is dropped."""
    one_digit_pairs = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    cfg = DataConfig(tasks={"chain_sum": 1.0}, task_config={"chain_sum": one_digit_pairs}, size=128)
    training = load_prompts(cfg)
    held_out = load_validation_prompts(cfg, None, 64, training)
    seen = {json.dumps(p.messages) for p in training}
    assert 0 < len(held_out) < 64  # some drawn questions were training ones, and went
    assert not any(json.dumps(p.messages) in seen for p in held_out)
    assert held_out == load_validation_prompts(cfg, None, 64, training)  # the same set every run
    assert load_prompts(cfg) == training  # training's draw is as without validation


def test_a_validation_file_is_read_as_data_files_are(tmp_path):
    path = tmp_path / "val.jsonl"
    rows = [
        {
            "data_source": "held/out",
            "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
            "reward_model": {"ground_truth": str(i + 1)},
        }
        for i in range(3)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trl = tmp_path / "more.jsonl"  # VERL's data.val_files is a list: files of either layout
    trl.write_text(json.dumps({"prompt": "What is 7 + 1?", "solution": "8"}) + "\n")
    train(tiny(tmp_path, "trainer.steps=1", "validation.every=1", f"validation.path=[{path},{trl}]"))
    row = lines(tmp_path / "run" / "validation.jsonl")[-1]
    assert row["val/prompts"] == 4 and "val/source/held/out" in row and "val/source/more" in row


@pytest.mark.parametrize(
    "overrides, message",
    [
        (("validation.path=val.jsonl",), "validation.path: got 'val.jsonl', expected validation.every >= 1"),
        (("validation.every=-1",), "validation.every: got -1, expected an integer >= 0"),
        (("validation.engine=gpu",), "validation.engine: got 'gpu', expected functions or learner"),
        (
            ("validation.every=2", "data.source=file", "data.path=train.jsonl"),
            "validation.path: got None, expected a held-out JSONL or Parquet file when data.source=file",
        ),
    ],
)
def test_a_bad_validation_setting_is_one_line_and_exit_2(overrides, message, tmp_path, capsys):
    assert main(["train", "--preset", "tiny", f"output_dir={tmp_path / 'run'}", *overrides]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_a_missing_validation_file_is_named_before_any_work(tmp_path, capsys):
    missing = tmp_path / "val.jsonl"
    args = ["train", "--preset", "tiny", f"output_dir={tmp_path / 'run'}", "validation.every=1"]
    assert main([*args, f"validation.path={missing}"]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def step_prompt(uid, ids, source="s"):
    return StepPrompt(Prompt(uid, [{"role": "user", "content": uid}], None, source, {}), uid, ids)


def test_the_shared_prefix_leaves_each_prompt_a_token_of_its_own():
    same = shared_prefix([step_prompt("a", [1, 2, 3]), step_prompt("b", [1, 2, 3, 4])])
    assert same.tokens == [[1, 2]] and same.node_of == {"a": 0, "b": 0}
    assert shared_prefix([step_prompt("a", [1, 2]), step_prompt("b", [3, 4])]) is None
    assert shared_prefix([step_prompt("a", [1, 2])]) is None


def test_prefilling_the_shared_prefix_once_gives_the_same_greedy_responses():
    engine = Engine(small_llama(256, 512), eos_token_ids=[1, 2], pad_token_id=0)
    system = [40, 41, 42, 43, 44, 45]
    prompts = [step_prompt(f"p{i}", system + [50 + i] * (i + 1)) for i in range(4)]
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    requests = [(p.uid, p.prompt_ids) for p in prompts]
    whole, _ = rollout(engine, requests, 1, params, -2, None)
    shared, stats = rollout(engine, requests, 1, params, -2, shared_prefix(prompts))
    assert [r.response_ids for r in whole] == [r.response_ids for r in shared]
    assert stats.unique_prefixes == 1


def test_best_of_n_is_the_mean_of_each_prompt_s_best_response():
    prompts = [step_prompt("a", [1], "x"), step_prompt("b", [2], "y")]
    samples = [
        Sample("a", 0, [1], [5], "stop", reward=0.0),
        Sample("a", 1, [1], [5], "stop", reward=1.0),
        Sample("b", 0, [2], [5], "stop", reward=0.5),
        Sample("b", 1, [2], [5], "stop", reward=0.0),
    ]
    metrics = validation_metrics(prompts, samples)
    assert metrics["reward/best@2"] == 0.75 and metrics["reward/mean"] == 0.375
    assert metrics["source/x"] == 0.5 and metrics["source/y"] == 0.25


def test_validation_only_scores_the_model_and_trains_nothing(tmp_path):
    """VERL's trainer.val_only: the held-out responses are the step-0 validation of a run."""
    train(tiny(tmp_path / "a", "trainer.steps=1", "validation.every=1", "validation.size=5"))
    result = train(tiny(tmp_path / "b", "validation.only=true", "validation.size=5"))
    run = tmp_path / "b" / "run"
    assert result.history == [] and [r["step"] for r in lines(run / "validation.jsonl")] == [0]
    assert not (run / "metrics.jsonl").exists() and not (run / "checkpoints").exists()
    assert (run / "config.yaml").is_file()
    trained_run = tmp_path / "a" / "run" / "validation" / "step_000000.jsonl"
    assert lines(run / "validation" / "step_000000.jsonl") == lines(trained_run)


def test_validation_only_with_resume_scores_the_run_s_last_checkpoint(tmp_path, capsys):
    args = ("trainer.steps=2", "validation.size=5")
    train(tiny(tmp_path, *args, "validation.every=1"))
    before = lines(tmp_path / "run" / "validation" / "step_000002.jsonl")
    run = str(tmp_path / "run")
    reward = f"reward.function={tmp_path / 'odd.py'}:odd_share"
    only = ("validation.only=true", "trainer.report=true", "--resume")
    code = main(["train", "--preset", "tiny", f"output_dir={run}", reward, *args, *only])
    out = capsys.readouterr().out
    assert code == 0 and "nothing to train" not in out and "report:" not in out
    assert [r["step"] for r in lines(tmp_path / "run" / "validation.jsonl")] == [0, 1, 2, 2]
    assert lines(tmp_path / "run" / "validation" / "step_000002.jsonl") == before  # the same weights


@pytest.mark.parametrize("key", ["validation.path", "data.path"])
def test_prompts_without_an_answer_to_score_are_refused_before_any_work(key, tmp_path, capsys):
    """Without reward.function, a row with no ground truth could not be scored: found when its first
    response was, it stopped a run after its forecast (a held-out one after training)."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"Name {i} colours."}) + "\n" for i in range(4)))
    args = ["train", "--preset", "tiny", f"output_dir={tmp_path / 'run'}", "validation.every=1"]
    files = [f"{key}={rows}"] + (
        ["data.source=file", f"validation.path={rows}"] if key == "data.path" else []
    )
    assert main([*args, *files]) == 2
    err = capsys.readouterr().err
    assert f"{rows}: row 1: no ground_truth" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_an_exported_policy_validates_as_the_run_s_last_validation(tmp_path):
    """Train, export, then `validation.only` on the exported model: the same held-out responses."""
    train(tiny(tmp_path / "a", "trainer.steps=2", "validation.every=2", "validation.size=5"))
    run = tmp_path / "a" / "run"
    assert main(["export", str(run), str(tmp_path / "export")]) == 0
    only = ("validation.only=true", "validation.size=5", f"model.path={tmp_path / 'export'}")
    train(tiny(tmp_path / "b", *only))
    exported = lines(tmp_path / "b" / "run" / "validation" / "step_000000.jsonl")
    assert [r["response"] for r in exported] == [
        r["response"] for r in lines(run / "validation" / "step_000002.jsonl")
    ]


def test_under_ray_validation_decodes_on_functions_as_on_the_learner_s_engine(tmp_path):
    """Two data-parallel ranks learn; the held-out set decodes on decode functions the planner
    sizes (the default) or on the driver's engine, whose policy follows the ranks: every held-out
    response as in-process, the trained policy's differ from the initial one's, and validating on
    functions changes no trained sample."""
    args = ("trainer.steps=2", "validation.every=1", "validation.size=5", "runtime.learner_width=2")
    runs = {
        "functions": ("runtime.executor=ray",),
        "learner": ("runtime.executor=ray", "validation.engine=learner"),
        "inprocess": ("runtime.executor=inprocess",),
    }
    for name, chosen in runs.items():
        train(tiny(tmp_path / name, *args, *chosen))
    for step in range(3):
        file = f"validation/step_{step:06d}.jsonl"
        responses = {name: [r["response"] for r in lines(tmp_path / name / "run" / file)] for name in runs}
        assert responses["functions"] == responses["learner"] == responses["inprocess"]
    for step in range(1, 3):
        file = f"rollouts/step_{step:06d}.jsonl"
        assert lines(tmp_path / "functions" / "run" / file) == lines(tmp_path / "inprocess" / "run" / file)
    first, last = (lines(tmp_path / "functions" / "run" / f"validation/step_{s:06d}.jsonl") for s in (0, 2))
    assert first != last
    on_functions = lines(tmp_path / "functions" / "run" / "validation.jsonl")
    assert all(v["validation/actors"] >= 1 and v["cost/validation"] > 0 for v in on_functions)
    assert not any("validation/actors" in v for v in lines(tmp_path / "learner" / "run" / "validation.jsonl"))
    # Each validation's plan and timeline are kept: every held-out prompt planned once, and the
    # functions that decoded them, on their nodes, billed as the metrics line says.
    held_out = {r["uid"] for r in lines(tmp_path / "functions" / "run" / "validation/step_000000.jsonl")}
    for step, row in zip(range(3), on_functions, strict=True):
        plan = json.loads(
            (tmp_path / "functions" / "run" / f"validation/plans/step_{step:06d}.json").read_text()
        )
        planned = [uid for actor in plan["actors"] for uid in actor["uids"]]
        assert sorted(planned) == sorted(held_out) and len(plan["actors"]) == row["validation/actors"]
        file = tmp_path / "functions" / "run" / f"validation/timeline/step_{step:06d}.json"
        timeline = json.loads(file.read_text())
        decode = [f for f in timeline["functions"] if f["kind"] == "decode"]
        assert len(decode) == row["validation/actors"] and all(f["node"] for f in decode)
        assert sum(f["cost"] for f in timeline["functions"]) == pytest.approx(row["cost/validation"])
