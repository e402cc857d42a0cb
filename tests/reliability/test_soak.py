"""The soak, short: five real steps under the Ray executor with a decode function and the prepare
function killed, and the driver killed inside a checkpoint write and resumed, lose and change no
sample, and learn exactly what the undisturbed run of the same seed learns.

`benchmarks/soak.py` runs both runs as `python -m rlhfless train` processes; seed 5 draws a
prepare exit at step 2 and a decode exit at step 4 (`runtime.fault_schedule`, rate 0.4), and the
checkpoint write of step 4 exits the driver after `rng.json`, so step 4 (and its decode exit)
runs again after the resume.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_soak_loses_and_changes_nothing_and_resumes_to_the_same_metrics(tmp_path):
    summary = tmp_path / "soak.json"
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "soak.py"),
        "--steps=5",
        "--faults=0.4",
        "--seed=5",
        "--driver-kills=0",
        "--checkpoint-kills=1",
        "--sim-steps=20",
        f"--out={tmp_path / 'runs'}",
        f"--json={summary}",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert summary.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    s = json.loads(summary.read_text())
    assert s["steps_completed"] == 5
    assert s["faults_by_kind"]["checkpoint_exit"] == 1
    assert s["faults_by_kind"]["functions"] >= 2  # the prepare exit and the decode exit (twice)
    assert s["faults_injected"] >= 3 and s["faults_survived"] == s["faults_injected"]
    assert s["samples"] == 5 * 16 and s["samples_lost"] == 0 and s["samples_changed"] == 0
    assert s["metrics_equal"], s["metrics_unequal"]
    assert [launch["interruption"] for launch in s["launches"]] == ["checkpoint_exit", None]
    assert s["sim"]["steps"] == 20
    assert done.returncode == 0
