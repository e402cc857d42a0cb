"""The planner's cluster is what Ray reports: alive nodes, their free slots, the driver's node first."""

import numpy as np
import pytest

from rlhfless.planner.hardware import ModelShape
from rlhfless.planner.placement import ClusterSpec
from rlhfless.runtime.ray_cluster import layout

SLOT = {"CPU": 1.0}


def node(node_id: str, cpus: float, alive: bool = True) -> dict:
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": "127.0.0.1", "Resources": {"CPU": cpus}}


def test_the_view_lists_alive_nodes_with_free_slots_driver_first_and_counts_the_learner_slot():
    nodes = [node("b", 2), node("a", 4), node("dead", 8, alive=False), node("full", 1), node("drv", 1)]
    held = {"a": 1, "full": 1, "drv": 0}  # slots our leased functions hold (idle warm ones give way)
    view = layout(nodes, "drv", SLOT, held, spare=100)
    assert [(n.node_id, n.free, n.total) for n in view.nodes] == [
        ("drv", 2, 2),  # its CPU and the learner's slot
        ("a", 3, 4),
        ("b", 2, 2),
    ]  # "full": its one slot held by our function; "dead": not alive
    shape = ModelShape("toy", layers=2, hidden=8, heads=2, kv_heads=2, intermediate=16, vocab=32)
    spec = view.spec(1, shape)
    assert spec.node_gpus == (2, 3, 2) and spec.max_actors(1) == 7


def test_slots_other_jobs_hold_come_off_the_nodes_with_the_fewest_free():
    nodes = [node("drv", 2), node("a", 4), node("b", 2), node("c", 1)]
    # Ray has 5 slots free in all, our accounting 9: other jobs hold 4, somewhere Ray does not say.
    view = layout(nodes, "drv", SLOT, {}, spare=5)
    assert [(n.node_id, n.free) for n in view.nodes] == [("drv", 3), ("a", 3)]  # c, b, then one of a
    # Even a full cluster keeps the driver's node: the learner's slot is never Ray's to give.
    assert [(n.node_id, n.free) for n in layout(nodes, "drv", SLOT, {}, spare=0).nodes] == [("drv", 1)]


def test_the_driver_node_must_be_alive():
    with pytest.raises(RuntimeError, match="driver"):
        layout([node("a", 1)], "drv", SLOT, {}, spare=1)


def test_a_cluster_of_unequal_nodes_places_slots_node_by_node():
    spec = ClusterSpec(node_gpus=(2, 3, 1))
    assert (spec.nodes, spec.gpus_per_node, spec.total_gpus) == (3, 3, 6)
    nodes, first_gpus = spec.slot_gpus(np.arange(7), 1)
    assert nodes.tolist() == [0, 0, 1, 1, 1, 2, 2]  # a slot past the cluster's stays on the last node
    assert first_gpus.tolist() == [0, 1, 2, 3, 4, 5, 6]
    uniform = ClusterSpec(nodes=2, gpus_per_node=4)
    assert uniform.node_slots(2) == [2, 2]
    assert [x.tolist() for x in uniform.slot_gpus(np.array([0, 3]), 2)] == [[0, 1], [0, 6]]
    skipped = ClusterSpec(node_gpus=(1, 4))  # node 0 holds no 2-GPU actor
    assert [x.tolist() for x in skipped.slot_gpus(np.array([0, 1]), 2)] == [[1, 1], [1, 3]]


def test_a_cluster_address_ray_cannot_join_is_one_line_naming_the_key(monkeypatch):
    import ray

    from rlhfless.runtime import ray_cluster
    from rlhfless.runtime_config import RuntimeConfig

    def refuse(**_):
        raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.9:6379\nretried 60 s")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(ray_cluster.ClusterError) as err:
        ray_cluster.start_ray(RuntimeConfig(ray_address="10.0.0.9:6379"))
    assert str(err.value) == (
        "runtime.ray_address: got '10.0.0.9:6379', expected the address of a running Ray cluster's head "
        "(`ray start --head`); Ray said: Failed to connect to Ray cluster at 10.0.0.9:6379"
    )
