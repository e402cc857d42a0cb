"""What the Ray cluster is now: its nodes, each node's actor slots, the driver's node, what is free.

The planner's `ClusterSpec` is read from Ray at the start of every step (`read_cluster`), so a plan
never asks for more than Ray can place now, and a node lost or added shows in the next plan. The
arithmetic (`layout`) is a pure function of what Ray reports, apart from the calls that ask it.
A slot is one function's resources (`cpus_per_actor` CPUs, or the plan's GPUs). The driver's node
also holds the learner's slot, which Ray does not see (the learner is this process); the embedded
Ray leaves it out of the CPUs it offers, and on an existing cluster the head should leave it out too.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

import ray
from ray._private.state import available_resources_per_node

from rlhfless.planner.hardware import ModelShape
from rlhfless.planner.placement import ClusterSpec
from rlhfless.runtime_config import RuntimeConfig

Resources = Mapping[str, float]


def start_ray(rt: RuntimeConfig) -> bool:
    """Connect to `rt.ray_address`, or start an embedded Ray on 127.0.0.1; True if we started it.

    The embedded instance offers this machine's cores minus the learner's slot (the driver
    process), so decode functions never oversubscribe the CPUs; on a CUDA run, its GPUs minus the
    learner's (`devices.learner_device`: the last), and none on a CPU run.
    """
    if ray.is_initialized():
        return False
    quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
    if rt.ray_address:
        ray.init(address=rt.ray_address, **quiet)
        return True
    cores = rt.num_cpus or os.cpu_count() or 1
    gpus = 0
    if rt.device != "cpu":
        import torch

        gpus = max(0, torch.cuda.device_count() - 1)
    ray.init(
        address="local",
        num_cpus=max(1, cores - rt.cpus_per_actor),
        num_gpus=gpus,
        include_dashboard=rt.dashboard,
        _node_ip_address="127.0.0.1",
        **quiet,
    )
    return True


@dataclass(frozen=True)
class NodeSlots:
    """One alive node as the step's plan sees it: `free` slots of `total` (the learner's included)."""

    node_id: str
    address: str
    total: int
    free: int
    driver: bool


@dataclass(frozen=True)
class ClusterView:
    """The nodes a plan may use, in the planner's order (the driver's first): plan node i is nodes[i]."""

    nodes: tuple[NodeSlots, ...]

    @property
    def driver(self) -> str:
        return self.nodes[0].node_id

    def node_id(self, index: int) -> str:
        return self.nodes[index].node_id

    def spec(self, units_per_slot: int, shape: ModelShape) -> ClusterSpec:
        """The planner's cluster: each node's free slots (as accelerator units), transfers sized by
        the model's weights and KV."""
        return ClusterSpec(
            node_gpus=tuple(n.free * units_per_slot for n in self.nodes),
            model_bytes=shape.weight_bytes,
            kv_bytes_per_token=shape.kv_bytes_per_token,
        )

    def to_dict(self) -> list[dict]:
        return [
            {"node": n.node_id, "address": n.address, "slots": n.total, "free": n.free, "driver": n.driver}
            for n in self.nodes
        ]


def slots_in(resources: Resources, slot: Resources) -> int:
    """How many whole slots `resources` hold."""
    return int(min(resources.get(key, 0.0) // need for key, need in slot.items() if need > 0))


def layout(
    nodes: list[dict],
    available: Mapping[str, Resources],
    driver: str,
    slot: Resources,
    reusable: Mapping[str, float],
) -> ClusterView:
    """The view from `ray.nodes()` records and each node's available resources: alive nodes with a
    free slot (the driver's always, it has the learner's), the driver's first, then by free slots
    (more first: heavier actors go to fuller nodes) and id. `reusable`: slots per node held by our
    own idle warm functions, which a plan may reuse or stop (keep-alive gives way to a request)."""
    out = []
    for n in nodes:
        if not n.get("Alive"):
            continue
        node_id = n["NodeID"]
        mine = node_id == driver
        free = slots_in(available.get(node_id, {}), slot) + int(reusable.get(node_id, 0)) + mine
        total = slots_in(n.get("Resources", {}), slot) + mine
        if free > 0:
            out.append(NodeSlots(node_id, n.get("NodeManagerAddress", ""), total, min(free, total), mine))
    out.sort(key=lambda n: (not n.driver, -n.free, n.node_id))
    if not out or not out[0].driver:
        raise RuntimeError(f"the driver's node {driver} is not among Ray's alive nodes")
    return ClusterView(tuple(out))


def read_cluster(slot: Resources, reusable: Mapping[str, float]) -> ClusterView:
    """The cluster as Ray reports it now (see `layout`)."""
    driver = ray.get_runtime_context().get_node_id()
    return layout(ray.nodes(), available_resources_per_node(), driver, slot, reusable)


def free_slots(node_id: str, slot: Resources) -> int:
    """Slots Ray has free on `node_id` now."""
    return slots_in(available_resources_per_node().get(node_id, {}), slot)
