"""SIGTERM (`ray job stop`, a scheduler's preemption) stops a run as Ctrl-C does: through its
`finally` blocks, one line and exit 143, with what its last checkpoint holds left to resume."""

import os
import signal

import pytest

from rlhfless.cli import main
from rlhfless.config import load_config
from rlhfless.runtime import ray_cluster, trainer
from rlhfless.runtime.checkpoint import list_checkpoints
from rlhfless.runtime_config import RuntimeConfig


def test_sigterm_stops_a_run_at_once_and_its_handler_is_put_back(tmp_path, monkeypatch):
    steps = []
    real_step = trainer.run_step

    def step_then_term(cfg, step, *args):
        steps.append(step)
        metrics = real_step(cfg, step, *args)
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return metrics

    monkeypatch.setattr(trainer, "run_step", step_then_term)
    before = signal.getsignal(signal.SIGTERM)
    cfg = load_config(
        preset="tiny", overrides=(f"output_dir={tmp_path / 'run'}", "trainer.steps=5", "trainer.save_every=1")
    )
    with pytest.raises(trainer.Interrupted, match="SIGTERM"):
        trainer.train(cfg)
    assert steps == [1, 2]  # stopped inside step 2, before its checkpoint: a resume redoes it
    assert [p.name for p in list_checkpoints(tmp_path / "run" / "checkpoints")] == ["step_000001"]
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_cli_says_which_signal_stopped_the_run(monkeypatch, capsys):
    def stopped(args):
        raise trainer.Interrupted("SIGTERM")

    monkeypatch.setattr("rlhfless.commands.train.run", stopped)
    assert main(["train", "--preset", "tiny"]) == 143
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stopped by SIGTERM" in err and "--resume" in err


def test_ray_init_does_not_take_the_driver_s_own_sigterm_handler(monkeypatch):
    """ray.init sets a handler of its own; a driver's Python handler is put back after it."""

    def ours(signum, frame):
        pass

    def ray_init(**kwargs):
        signal.signal(signal.SIGTERM, lambda signum, frame: None)  # as ray.init does

    monkeypatch.setattr(ray_cluster.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_cluster.ray, "init", ray_init)
    before = signal.signal(signal.SIGTERM, ours)
    try:
        assert ray_cluster.start_ray(RuntimeConfig(ray_address="10.0.0.9:6379"))
        assert signal.getsignal(signal.SIGTERM) is ours
    finally:
        signal.signal(signal.SIGTERM, before)
