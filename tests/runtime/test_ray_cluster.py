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

RAY = str(Path(sys.executable).with_name("ray"))
POLITE_S = 2  # seconds the head's processes get to exit on SIGTERM


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


def _head_node_id(address: str) -> str:
    ray.init(address=address, log_to_driver=False)
    try:
        return ray.get_runtime_context().get_node_id()
    finally:
        ray.shutdown()


def stop(head: subprocess.Popen) -> None:
    """Stop the head's process group: politely, then for sure. Once a job has run, `ray start
    --block` takes over 30 s to wind down after SIGTERM (its raylet is gone in a moment, the GCS
    and the autoscaler's monitor linger): a short grace, then SIGKILL to the group."""
    os.killpg(head.pid, signal.SIGTERM)
    try:
        head.wait(timeout=POLITE_S)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(head.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    head.wait(timeout=15)


def test_training_uses_the_existing_cluster_and_writes_costs_and_timelines(cluster, tmp_path):
    # The CLI in its own process, as a user runs it: nothing of this test process's Ray state.
    run = subprocess.run(
        [str(Path(sys.executable).with_name("rlhfless")), "train", "--preset", "tiny"]
        + [f"output_dir={tmp_path / 'run'}", "trainer.steps=1", "trainer.progress=false"]
        + ["runtime.executor=ray", f"runtime.ray_address={cluster}"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    [timeline_file] = (tmp_path / "run" / "timeline").glob("step_*.json")
    nodes = {f["node"] for f in json.loads(timeline_file.read_text())["functions"] if f.get("node")}
    assert nodes == {_head_node_id(cluster)}  # every function ran on the given cluster's one node
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
