"""Training on an existing Ray cluster, end to end, by docs/CLUSTER.md's recipe: `ray job submit
--working-dir .` runs `rlhfless train ... runtime.ray_address=auto` on a two-node cluster; its step
uses both nodes and the run records its bills and timelines.

The cluster is `ray.cluster_utils.Cluster` (a head with the dashboard, which takes job
submissions, and a worker; one CPU each), started from this environment with its `bin/` on PATH,
as the recipe asks, and without token authentication (`RAY_AUTH_MODE=disabled`), as on a private
test cluster. The job is submitted with Ray's own CLI, as a user does, which follows it to its end.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray
from cluster_support import free_port, shut_down
from ray.cluster_utils import Cluster
from ray.job_submission import JobStatus, JobSubmissionClient

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
METRICS = ("cost/step", "cost/generation", "cost/learning", "actors/decode", "actors/cold_starts")
METRICS += ("migrations", "time/weight_sync", "time/kv_transfer", "bytes/weight_sync", "bytes/kv_transfer")


@pytest.fixture(scope="module")
def cluster():
    assert not ray.is_initialized()
    with pytest.MonkeyPatch.context() as env:  # what every node's processes, the job's included, inherit
        env.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
        env.setenv("RAY_AUTH_MODE", "disabled")
        dashboard, agent = free_port("127.0.0.1"), free_port()
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "include_dashboard": True,
                "dashboard_port": dashboard,
                # A head's job agent listens on 52365 unless told: another Ray on this machine
                # (a test running beside this one) may hold it, and then no job can be submitted.
                "dashboard_agent_listen_port": agent,
            },
        )
        cluster.worker = cluster.add_node(num_cpus=1)
        cluster.dashboard = f"http://127.0.0.1:{dashboard}"
        try:
            yield cluster
        finally:
            shut_down(cluster)


def ray_cli(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "ray"), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=os.environ
    )


def test_ray_job_submit_trains_on_the_existing_cluster_across_its_nodes(cluster, tmp_path):
    run_dir = tmp_path / "grpo"
    submitted = ray_cli(
        "job", "submit", "--address", cluster.dashboard, "--submission-id", "rlhfless-recipe",
        "--working-dir", ".", "--",
        "rlhfless", "train", "--preset", "tiny", "runtime.executor=ray", "runtime.ray_address=auto",
        "scheduler.n_min=3", "trainer.steps=1", "trainer.progress=false", f"output_dir={run_dir}",
        timeout=300,
    )  # fmt: skip
    printed = submitted.stdout[-3000:] + submitted.stderr[-2000:]
    assert submitted.returncode == 0, printed
    status = JobSubmissionClient(cluster.dashboard).get_job_status("rlhfless-recipe")
    assert status == JobStatus.SUCCEEDED, printed
    # The working directory went to the cluster as Ray's runtime environment, as the recipe ships it.
    assert "Uploading package" in submitted.stdout + submitted.stderr
    timeline = json.loads((run_dir / "timeline" / "step_000001.json").read_text())
    head, worker = cluster.head_node.node_id, cluster.worker.node_id
    assert [n["node"] for n in timeline["nodes"]] == [head, worker]
    decode = [f for f in timeline["functions"] if f["kind"] == "decode"]
    assert sorted(f["node"] for f in decode) == sorted([head, head, worker])
    [on_worker] = [f["name"] for f in decode if f["node"] == worker]
    crossing = [t for t in timeline["transfers"] if t["target"] == on_worker]
    assert crossing and not any(t["same_node"] for t in crossing)
    assert {"learner", "decode"} <= {f["kind"] for f in timeline["functions"]}
    [metrics] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert set(METRICS) <= set(metrics)
    assert metrics["cluster/nodes"] == 2
    assert sum(f["cost"] for f in timeline["functions"]) == pytest.approx(metrics["cost/step"])
