"""A `tiny` run writes every documented file, and a killed run resumes to the same numbers."""

import json
import math
import shutil

import pytest

from rlhfless.cli import main
from rlhfless.config import load_config
from rlhfless.runtime.checkpoint import list_checkpoints
from rlhfless.runtime.trainer import train

REQUIRED = (
    "step",
    "reward/mean",
    "reward/std",
    "response_length/mean",
    "response_length/max",
    "kl/mean",
    "loss/policy",
    "grad_norm",
    "time/step",
    "time/generation",
    "time/preparation",
    "time/learning",
    "prefill/tokens_computed",
    "prefill/tokens_naive",
    "prefill/tokens_unique",
    "prefill/tree_ratio",
    "time/prefill",
    "time/decode",
)
# Deterministic training quantities (timings are not).
COMPARED = ("reward/mean", "response_length/mean", "kl/mean", "loss/policy", "grad_norm")


def tiny(tmp_path, *overrides):
    return load_config(
        preset="tiny", overrides=(f"output_dir={tmp_path / 'run'}", "trainer.progress=false", *overrides)
    )


def read_metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_two_step_tiny_run_writes_the_run_directory(tmp_path):
    code = main(["train", "--preset", "tiny", f"output_dir={tmp_path / 'run'}", "trainer.progress=false"])
    assert code == 0
    run = tmp_path / "run"
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for key in REQUIRED:
            assert isinstance(row[key], int | float) and math.isfinite(row[key]), key
        assert row["prefill/tokens_computed"] < row["prefill/tokens_naive"]
        # the prefix tree's levels and each prompt's own part, as planned: near the unique tokens
        assert row["prefill/tree_ratio"] == row["plan/tree_ratio"] < 1.1
    assert (run / "config.yaml").exists()
    rollouts = [json.loads(x) for x in (run / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    assert len(rollouts) == 4 * 4
    assert {(r["uid"], r["sample"]) for r in rollouts} == {(r["uid"], s) for r in rollouts for s in range(4)}
    assert all(
        set(r) >= {"uid", "sample", "prompt", "response", "response_tokens", "reward"} for r in rollouts
    )
    assert (run / "plans" / "step_000002.json").exists()
    assert list((run / "tb").glob("events.out.tfevents.*"))
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step_000001", "step_000002"]
    ckpt = run / "checkpoints" / "step_000002"
    assert {"model.safetensors", "optimizer.pt", "rng.json", "trainer_state.json"} <= {
        p.name for p in ckpt.iterdir()
    }


class Killed(Exception):
    pass


def test_killed_run_resumes_to_the_same_step_3_metrics(tmp_path):
    straight = train(tiny(tmp_path / "a", "trainer.steps=3", "trainer.save_every=1"))
    want = straight.history[2]

    def die_in_step_3(kind, info):
        if kind == "phase" and info["step"] == 3 and info["phase"] == "learn":
            raise Killed

    with pytest.raises(Killed):
        train(tiny(tmp_path / "b", "trainer.steps=3", "trainer.save_every=1"), die_in_step_3)
    resumed = train(tiny(tmp_path / "b", "trainer.steps=3", "trainer.save_every=1", "resume=true"))
    assert [h["step"] for h in resumed.history] == [3]
    got = resumed.history[0]
    for key in COMPARED:
        assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), key
    assert [r["step"] for r in read_metrics(tmp_path / "b" / "run")] == [1, 2, 3]
    summary = json.loads((tmp_path / "b" / "run" / "summary.json").read_text())
    assert (summary["steps"], summary["last_step"], summary["window"]) == (3, 3, 1)
    first = straight.history[0]["reward/mean"]  # a step before the resume still counts
    assert summary["first_reward"] == summary["first_window/reward/mean"] == pytest.approx(first)


def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path, capsys):
    code = main(["train", "--preset", "tiny", f"output_dir={tmp_path / 'none'}", "--resume"])
    assert code == 2
    assert "no checkpoint under" in capsys.readouterr().err


def test_resuming_a_finished_run_says_there_is_nothing_to_train_and_changes_nothing(tmp_path, capsys):
    argv = ["train", "--preset", "tiny", f"output_dir={tmp_path / 'run'}", "trainer.progress=false"]
    assert main([*argv, "trainer.steps=1"]) == 0
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main([*argv, "trainer.steps=1", "--resume"]) == 0
    assert "nothing to train: the run is at trainer.steps=1; raise it to go on" in capsys.readouterr().out
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before


def test_a_new_run_never_writes_over_a_trained_one(tmp_path, capsys):
    """Without --resume, an output_dir holding a trained run is refused before anything is
    written: its metrics and checkpoints stay as they were."""
    argv = ["train", "--preset", "tiny", f"output_dir={tmp_path / 'run'}", "trainer.progress=false"]
    assert main([*argv, "trainer.steps=2"]) == 0
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main([*argv, "trainer.steps=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a trained run (checkpoints to step_000002)" in err
    assert {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()} == before


def test_resume_auto_starts_a_new_run_and_continues_it_when_run_again(tmp_path):
    """One command for a preemptible job: resume=auto starts where nothing is, resumes after."""
    argv = ["train", "--preset", "tiny", f"output_dir={tmp_path / 'run'}", "trainer.progress=false"]
    assert main([*argv, "trainer.steps=1", "resume=auto"]) == 0
    assert main([*argv, "trainer.steps=2", "resume=auto"]) == 0
    assert [row["step"] for row in read_metrics(tmp_path / "run")] == [1, 2]
    assert [p.name for p in list_checkpoints(tmp_path / "run" / "checkpoints")] == [
        "step_000001",
        "step_000002",
    ]


def test_resume_takes_true_false_or_auto(capsys):
    assert load_config(preset="tiny", overrides=("resume=auto",)).resume == "auto"
    assert main(["train", "--preset", "tiny", "resume=maybe"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "resume: got 'maybe'" in err


def test_a_run_with_metrics_and_no_checkpoint_is_refused_even_by_resume_auto(tmp_path, capsys):
    """Nothing to resume from, and a new run would overwrite its metrics."""
    argv = ["train", "--preset", "tiny", f"output_dir={tmp_path / 'run'}", "trainer.progress=false"]
    assert main([*argv, "trainer.steps=2", "trainer.save_every=0", "trainer.keep_checkpoints=1"]) == 0
    for checkpoint in list_checkpoints(tmp_path / "run" / "checkpoints"):  # as a run killed before one
        shutil.rmtree(checkpoint)
    capsys.readouterr()
    assert main([*argv, "trainer.steps=3", "resume=auto"]) == 2
    assert "holds a trained run's metrics and no checkpoint" in capsys.readouterr().err


def test_an_output_dir_under_a_file_is_one_line_before_anything_loads(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "run"
    assert main(["train", "--preset", "tiny", f"output_dir={out}", "trainer.progress=false"]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "output_dir: " in err
        and "is a file, expected a directory to write in" in err
    )
