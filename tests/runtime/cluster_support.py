"""Shared by the tests that start a multi-node `ray.cluster_utils.Cluster` of their own."""

import socket
import time

import psutil
from ray.cluster_utils import Cluster

GRACE_S = 15  # Ray's shutdown is asynchronous: its processes get this long to exit


def shut_down(cluster: Cluster) -> None:
    """Stop the cluster and fail if any process of its session outlives the grace period."""
    session = cluster.head_node.get_session_dir_path()
    cluster.shutdown()
    deadline = time.time() + GRACE_S
    while time.time() < deadline and processes_of(session):
        time.sleep(0.5)
    assert not processes_of(session), "a Ray process of the test cluster outlived it"


def processes_of(session: str) -> list[int]:
    """Pids of the processes whose command line names the Ray session directory."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(session in part for part in p.info["cmdline"] or []):
                out.append(p.info["pid"])
        except psutil.Error:
            pass
    return out


def free_port(host: str = "") -> int:
    """A TCP port free on `host` now (all of this node's addresses by default), for a port Ray's
    own processes take by number: it can be taken between this and their start, a rare race a
    test accepts."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
