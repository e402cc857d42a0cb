"""Given `runtime.ray_address`, training runs on that existing Ray cluster and records its bills."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray

from rlhfless.config import load_config
from rlhfless.runtime.trainer import train

RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """`ray start --head` on 127.0.0.1, in its own process group, stopped by that group's id."""
    assert not ray.is_initialized()
    port = free_port()
    head = subprocess.Popen(
        [RAY, "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=1"]
        + ["--include-dashboard=false", "--disable-usage-stats"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},  # clients here do not send a token
    )
    address = f"127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        probe = subprocess.run([RAY, "status", f"--address={address}"], capture_output=True)
        if probe.returncode == 0:
            break
        time.sleep(1)
    else:
        stop(head)
        pytest.fail(f"ray start --head on {address} did not come up")
    yield address
    stop(head)


def stop(head: subprocess.Popen) -> None:
    """Stop the head's process group: politely, then for sure."""
    os.killpg(head.pid, signal.SIGTERM)
    try:
        head.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(head.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    head.wait(timeout=15)


def test_training_uses_the_existing_cluster_and_writes_costs_and_timelines(cluster, tmp_path):
    cfg = load_config(
        preset="tiny",
        overrides=(
            f"output_dir={tmp_path / 'run'}",
            "trainer.steps=1",
            "trainer.progress=false",
            "runtime.executor=ray",
            f"runtime.ray_address={cluster}",
        ),
    )
    seen = []
    train(
        cfg, on_event=lambda kind, info: kind == "step" and seen.append(ray.get_runtime_context().gcs_address)
    )
    port = lambda address: address.rsplit(":", 1)[1]  # noqa: E731  (Ray reports the host's own IP)
    assert [port(a) for a in seen] == [port(cluster)]
    assert not ray.is_initialized()  # disconnected at the end; the cluster itself stays up
    [metrics] = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for key in (
        "cost/step",
        "cost/generation",
        "cost/learning",
        "actors/decode",
        "actors/cold_starts",
        "migrations",
    ):
        assert key in metrics
    for key in ("time/weight_sync", "time/kv_transfer", "bytes/weight_sync", "bytes/kv_transfer"):
        assert key in metrics
    timeline = json.loads((tmp_path / "run" / "timeline" / "step_000001.json").read_text())
    kinds = {f["kind"] for f in timeline["functions"]}
    assert {"learner", "decode"} <= kinds
    assert sum(f["cost"] for f in timeline["functions"]) == pytest.approx(metrics["cost/step"])
