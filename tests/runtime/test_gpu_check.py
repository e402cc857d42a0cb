"""scripts/gpu_check.sh runs its whole path on a CPU: the CUDA tests (skipped here), GRPO steps under
verl and rlhfless, and the CPU/device sample identity, with the same script a GPU machine runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # Ray and six cold-started functions: minutes on a shared 2-core CPU
def test_gpu_check_runs_its_whole_path_on_a_cpu(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "DEVICE": "cpu", "MODEL": "tiny", "STEPS": "2"}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--out", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert "sample identity, cpu vs cpu functions: 16/16 identical" in out
    assert "sample identity, cut on cpu, resumed on cpu: 16/16 identical" in out
    assert "rounded {'span_quantum': 64}" in out and "a bare decode forward" in out
    assert "sequences identical in every engine run: 32/32" in out
    for row in ("step time (s)", "prefill busy (s)", "prompt tokens computed", "cost per step ($)"):
        assert row in out
    assert "gpu_check: ok" in out
