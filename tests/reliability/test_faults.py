"""Injected faults are a config surface: listed or drawn from a seed, the same every time, refused
with one line naming the key; a driver killed inside a checkpoint write resumes from the last
complete checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from rlhfless.cli import main
from rlhfless.config import load_config
from rlhfless.faults import SCHEDULED, DecodeFault, FaultSchedule, parse_faults
from rlhfless.runtime.checkpoint import list_checkpoints
from rlhfless.runtime.runlog import RunLog

SRC = Path(__file__).resolve().parents[2] / "src"
FAST = ("trainer.progress=false", "trainer.tensorboard=false")


def test_listed_faults_and_a_schedule_load_from_dotted_overrides():
    cfg = load_config(
        preset="tiny",
        overrides=(
            "runtime.faults=[{kind: decode_exit, step: 2, actor: 0, after: 3},"
            " {kind: slow, step: 3, actor: 1, seconds: 2}, {kind: prepare_exit, step: 3}]",
            "runtime.fault_schedule={seed: 4, rate: 0.5, kinds: [decode_exit, slow]}",
        ),
    )
    plan = cfg.runtime.fault_plan
    assert [(f.kind, f.step) for f in plan.listed] == [("decode_exit", 2), ("slow", 3), ("prepare_exit", 3)]
    assert plan.listed[1].seconds == 2.0 and plan.schedule.kinds == ("decode_exit", "slow")
    assert plan.prepare(3) == (True, 0.0) and plan.prepare(2) == (False, 0.0)
    assert not load_config(preset="tiny").runtime.fault_plan  # no faults by default


def test_a_schedule_is_a_pure_function_of_its_seed_and_the_step():
    a, b = FaultSchedule(seed=7, rate=0.3), FaultSchedule(seed=7, rate=0.3)
    drawn = [a.at(step) for step in range(1, 201)]
    assert drawn == [b.at(step) for step in range(1, 201)]
    assert drawn != [FaultSchedule(seed=8, rate=0.3).at(step) for step in range(1, 201)]
    hits = sum(len(d) for d in drawn)
    assert 30 <= hits <= 90  # about 0.3 a step
    assert {f.kind for d in drawn for f in d} == set(SCHEDULED)
    assert all(FaultSchedule(seed=7, rate=1.0).at(step) for step in range(1, 50))
    assert not any(FaultSchedule(seed=7, rate=0.0).at(step) for step in range(1, 50))


def test_decode_faults_go_to_the_actor_modulo_the_plan_and_node_faults_never_to_the_drivers_node():
    plan = parse_faults(
        [
            {"kind": "decode_exit", "step": 1, "actor": 3, "after": 5},
            {"kind": "node_exit", "step": 1, "node": 1, "after": 2},
            {"kind": "slow", "step": 2, "actor": 0, "seconds": 0.5},
        ],
        {},
    )
    actors = [(0, 0, True), (1, 0, False), (2, 1, False), (3, 1, False)]  # (plan actor, node, colocated)
    assert plan.decode(1, actors[:2], driver_node=0) == {1: [DecodeFault("decode_exit", 5)]}
    assert plan.decode(1, actors, driver_node=0) == {
        3: [DecodeFault("decode_exit", 5)],
        2: [DecodeFault("node_exit", 2)],
    }
    assert 2 not in plan.decode(1, actors, driver_node=1)  # node 1 is the driver's: never killed
    assert plan.decode(2, actors, driver_node=0) == {0: [DecodeFault("slow", 1, 0.5)]}
    assert plan.decode(3, actors, driver_node=0) == {}


def test_a_decode_fault_may_name_the_colocated_or_the_first_remote_function_wherever_the_plan_puts_it():
    plan = parse_faults(
        [
            {"kind": "slow", "step": 1, "actor": "colocated", "seconds": 0.5},
            {"kind": "decode_exit", "step": 1, "actor": "remote", "after": 4},
        ],
        {},
    )
    heavier_first = [(0, 0, True), (1, 0, False), (2, 1, False)]
    heavier_second = [(0, 1, False), (1, 0, True), (2, 0, False)]
    assert plan.decode(1, heavier_first, driver_node=0) == {
        0: [DecodeFault("slow", 1, 0.5)],
        1: [DecodeFault("decode_exit", 4)],
    }
    assert plan.decode(1, heavier_second, driver_node=0) == {
        1: [DecodeFault("slow", 1, 0.5)],
        0: [DecodeFault("decode_exit", 4)],
    }
    # a plan with no colocated function (verl's), or none elsewhere: that fault does not fire
    assert plan.decode(1, [(0, 0, False)], driver_node=0) == {0: [DecodeFault("decode_exit", 4)]}
    assert plan.decode(1, [(0, 0, True)], driver_node=0) == {0: [DecodeFault("slow", 1, 0.5)]}


def test_a_schedule_draws_a_nodes_loss_only_when_its_kinds_list_it_and_never_on_one_node():
    plan = parse_faults([], {"seed": 3, "rate": 1.0, "kinds": ["node_exit"]})
    drawn = [f for step in range(1, 21) for f in plan.at(step)]
    assert len(drawn) == 20 and {(f.kind, f.node) for f in drawn} == {("node_exit", 1)}
    two_nodes, one_node = [(0, 0, True), (1, 0, False), (2, 1, False)], [(0, 0, True), (1, 0, False)]
    assert plan.decode(4, two_nodes, driver_node=0) == {2: [DecodeFault("node_exit", plan.at(4)[0].after)]}
    assert plan.decode(4, one_node, driver_node=0) == {}  # no plan node 1: nothing to kill


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("runtime.faults=[{kind: boom, step: 1}]", "runtime.faults[0].kind: got 'boom', expected one of"),
        ("runtime.faults=[{kind: slow, step: 0}]", "runtime.faults[0].step: got 0, expected an integer >= 1"),
        ("runtime.faults=[{kind: slow}]", "runtime.faults[0].step: missing"),
        ("runtime.faults=[{kind: slow, step: 1, file: x}]", "runtime.faults[0].file: unknown key"),
        ("runtime.faults=[{kind: slow, step: 1, seconds: -1}]", "runtime.faults[0].seconds: got -1"),
        ("runtime.faults=[{kind: node_exit, step: 1, node: 0}]", "runtime.faults[0].node: got 0"),
        (
            "runtime.faults=[{kind: slow, step: 1, actor: learner}]",
            "runtime.faults[0].actor: got 'learner', expected one of colocated, remote",
        ),
        (
            "runtime.faults=[{kind: checkpoint_exit, step: 1, file: x.pt}]",
            "runtime.faults[0].file: got 'x.pt'",
        ),
        ("runtime.faults=[3]", "runtime.faults[0]: got 3, expected a mapping"),
        ("runtime.fault_schedule={rate: 2}", "runtime.fault_schedule.rate: got 2, expected a probability"),
        ("runtime.fault_schedule={kinds: [checkpoint_exit]}", "runtime.fault_schedule.kinds[0]: got"),
        ("runtime.fault_schedule={seed: 0, when: 3}", "runtime.fault_schedule.when: unknown key"),
    ],
)
def test_a_bad_fault_spec_is_one_line_naming_the_key_and_exit_2(override, message, capsys, tmp_path):
    assert main(["train", "--preset", "tiny", f"output_dir={tmp_path / 'run'}", override]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_a_metrics_line_cut_short_by_a_kill_is_dropped_on_resume(tmp_path):
    rows = [{"step": 1, "reward/mean": 0.5}, {"step": 2, "reward/mean": 0.25}]
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "rew'
    (tmp_path / "metrics.jsonl").write_text(text)
    log = RunLog(tmp_path, tensorboard=False, wandb_project=None, config={}, resumed_at=2)
    assert log.rows() == rows


def test_a_resumed_run_forgets_the_validations_after_its_checkpoint(tmp_path):
    """A validation after the checkpoint is redone with its step: validation.jsonl keeps one each."""
    killed = RunLog(tmp_path, tensorboard=False, wandb_project=None, config={})
    for step in (0, 2, 4):
        killed.validation(step, {"val/reward/mean": step / 10})
    resumed = RunLog(tmp_path, tensorboard=False, wandb_project=None, config={}, resumed_at=3)
    assert [v["step"] for v in resumed.validations()] == [0, 2]


def test_a_resumed_run_purges_the_killed_run_s_later_tensorboard_points(tmp_path):
    """Steps after the checkpoint are redone: TensorBoard shows each once, the redone value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    killed = RunLog(tmp_path, tensorboard=True, wandb_project=None, config={})
    for step in (1, 2, 3):
        killed.metrics(step, {"reward/mean": float(step)})
    killed.close()
    resumed = RunLog(tmp_path, tensorboard=True, wandb_project=None, config={}, resumed_at=1)
    resumed.metrics(2, {"reward/mean": 20.0})
    resumed.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == [(1, 1.0), (2, 20.0)]
    assert [row["step"] for row in resumed.rows()] == [1, 2]


def test_a_resumed_run_logs_on_into_the_w_and_b_run_it_started(tmp_path, monkeypatch):
    """A requeued job's W&B charts stay one run: its id is kept and resumed ("allow")."""
    calls = []

    class Run:
        def __init__(self, **kwargs):
            calls.append(kwargs)
            self.id = kwargs.get("id", f"run{len(calls)}")

        def log(self, values, step):
            pass

        def finish(self):
            pass

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=lambda **kw: Run(**kw)))
    RunLog(tmp_path, tensorboard=False, wandb_project="p", config={}).close()
    RunLog(tmp_path, tensorboard=False, wandb_project="p", config={}, resumed_at=3).close()
    assert "id" not in calls[0] and (calls[1]["id"], calls[1]["resume"]) == ("run1", "allow")


def _train(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rlhfless", "train", "--preset", "tiny", f"output_dir={out}", *FAST]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([*cmd, *overrides], capture_output=True, text=True, env=env, timeout=300)


def test_a_driver_killed_inside_a_checkpoint_write_resumes_from_the_last_complete_one(tmp_path):
    out = tmp_path / "run"
    died = _train(out, "trainer.steps=3", "runtime.faults=[{kind: checkpoint_exit, step: 2, file: rng.json}]")
    assert died.returncode == 137, died.stderr[-2000:]
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == ["step_000001"]
    [half] = [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".step_000002")]
    assert {p.name for p in half.iterdir()} == {"model.safetensors", "optimizer.pt", "rng.json"}

    resumed = _train(out, "trainer.steps=3", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == ["step_000002", "step_000003"]
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
