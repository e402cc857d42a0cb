"""The soak, short: five real steps under the Ray executor with the prepare function and a decode
function killed, and the driver killed inside a checkpoint write and resumed, lose and change no
sample, and learn exactly what the undisturbed run of the same seed learns.

`benchmarks/soak.py` runs both runs as `python -m rlhfless train` processes. Seed 65 has the
driver exit in step 2's checkpoint write, after `rng.json`; the resumed launch starts from step
1's checkpoint and meets the schedule's prepare exit at step 4 and decode exit at step 5
(`runtime.fault_schedule`, rate 0.4). Kept cheap for `make test`: three launches in all (the
least a kill and a resume allow), one decode function a step, the faulty run's launches on one Ray
the soak starts (`--shared-ray`), and the undisturbed run beside them on its own (`--parallel`).
Its comparison is tested to see a lost or changed sample and a metric that drifts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOAK = ROOT / "benchmarks" / "soak.py"


def _soak_module():
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # 68 s of a 9-10 minute suite on a slow 2-core machine; each fault has its own test
def test_a_short_soak_loses_and_changes_nothing_and_resumes_to_the_same_metrics(tmp_path):
    summary = tmp_path / "soak.json"
    cmd = [
        sys.executable,
        str(SOAK),
        "--steps=5",
        "--faults=0.4",
        "--seed=65",
        "--driver-kills=0",
        "--checkpoint-kills=1",
        "--functions=1",
        "--shared-ray",
        "--parallel",
        "--sim-steps=20",
        f"--out={tmp_path / 'runs'}",
        f"--json={summary}",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert summary.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    s = json.loads(summary.read_text())
    assert s["steps_completed"] == 5
    assert s["faults_by_kind"] == {"functions": 2, "node_exit": 0, "driver_kill": 0, "checkpoint_exit": 1}
    assert s["faults_survived"] == s["faults_injected"] == 3
    assert s["samples"] == 5 * 16 and s["samples_lost"] == 0 and s["samples_changed"] == 0
    assert s["metrics_equal"], s["metrics_unequal"]
    first, resumed = s["launches"]
    assert (first["interruption"], first["exit"]) == ("checkpoint_exit", 137)
    assert (resumed["interruption"], resumed["exit"]) == (None, 0)
    assert resumed["steps_logged"] == 4  # steps 2..5: resumed from step 1's checkpoint, not from scratch
    assert first["processes_outlived"] == resumed["processes_outlived"] == []
    assert s["sim"]["steps"] == 20
    assert done.returncode == 0


def _run_dir(path: Path, rows: list[dict], samples: list[dict]) -> Path:
    (path / "rollouts").mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "rollouts" / "step_000001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))
    return path


def _counts(diff: dict) -> tuple:
    return diff["samples"], diff["samples_lost"], diff["samples_changed"], diff["metrics_equal"]


def test_the_soak_comparison_counts_a_lost_or_changed_sample_and_a_metric_that_drifts(tmp_path):
    soak = _soak_module()
    fields = {"prompt_ids": [1, 2], "response": "ab", "response_tokens": 2, "reward": 0.5}
    samples = [{"uid": u, "sample": k, **fields, "finish_reason": "stop"} for u in "ab" for k in (0, 1)]
    row = {"step": 1, "reward/mean": 0.5, "loss/policy": 0.25}
    clean = _run_dir(tmp_path / "clean", [row], samples)

    within = _run_dir(tmp_path / "within", [row | {"loss/policy": 0.25 * (1 + 1e-7)}], samples)
    assert _counts(soak.compare(clean, within, 1)) == (4, 0, 0, True)

    changed = [*samples[1:3], samples[3] | {"response": "ac"}]  # (a, 0) lost, (b, 1) changed
    broken = _run_dir(tmp_path / "broken", [row | {"loss/policy": 0.25 * (1 + 1e-5)}], changed)
    diff = soak.compare(clean, broken, 1)
    assert _counts(diff) == (4, 1, 1, False)
    assert diff["lost_examples"] == [[1, "a", 0]] and diff["changed_examples"] == [[1, "b", 1]]
    assert diff["metrics_unequal"] == [(1, "loss/policy")]
