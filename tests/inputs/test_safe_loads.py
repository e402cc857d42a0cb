"""Nothing a run directory holds can execute code when read, and an embedded Ray listens locally."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from conftest import FAST
from inputs_support import refused, snapshot

SRC = Path(__file__).resolve().parents[2] / "src"


class RunsCode:
    """Unpickling this calls `exec`: what a malicious checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').close()",))


def test_every_torch_load_in_src_is_weights_only():
    calls = [
        (path, line)
        for path in SRC.rglob("*.py")
        for line in path.read_text().splitlines()
        if re.search(r"torch\.load\(", line)
    ]
    assert calls, "expected the checkpoint reader's torch.load"
    for path, line in calls:
        assert "weights_only=True" in line, f"{path}: {line.strip()}"


def test_a_checkpoint_whose_pickle_runs_code_is_refused(run_copy, tmp_path, capsys):
    marker = tmp_path / "pwned"
    checkpoint = run_copy / "checkpoints" / "step_000001"
    torch.save({"learner": RunsCode(marker), "version": 1}, checkpoint / "optimizer.pt")
    before = snapshot(run_copy)
    argv = ["train", "--preset", "tiny", f"output_dir={run_copy}", "trainer.steps=2", *FAST, "--resume"]
    refused(capsys, argv, "optimizer.pt", "refused", "expected tensors")
    assert not marker.exists()
    assert snapshot(run_copy) == before


def test_rng_state_is_json_not_a_pickle(trained_run):
    checkpoint = trained_run / "checkpoints" / "step_000001"
    assert (checkpoint / "rng.json").is_file() and not (checkpoint / "rng.pt").exists()


def test_an_embedded_ray_binds_to_localhost_unless_an_address_is_given(monkeypatch):
    from rlhfless.runtime import ray_cluster
    from rlhfless.runtime_config import RuntimeConfig

    calls: list[dict] = []
    monkeypatch.setattr(ray_cluster.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_cluster.ray, "init", lambda **kwargs: calls.append(kwargs))
    assert ray_cluster.start_ray(RuntimeConfig())
    assert calls[-1]["address"] == "local" and calls[-1]["_node_ip_address"] == "127.0.0.1"
    assert ray_cluster.start_ray(RuntimeConfig(ray_address="10.0.0.5:6379"))
    assert calls[-1]["address"] == "10.0.0.5:6379" and "_node_ip_address" not in calls[-1]
