"""What the Ray cluster is now: its nodes, each node's actor slots, the driver's node, what is free.

The planner's `ClusterSpec` is read from Ray at the start of every step (`read_cluster`), so a plan
never asks for more than Ray can place now, and a node lost or added shows in the next plan. The
arithmetic (`layout`) is a pure function of what Ray reports, apart from the calls that ask it.
A slot is one function's resources (`cpus_per_actor` CPUs, or the plan's GPUs). The driver's node
also holds the learner's slot, which Ray does not see (the learner is this process); the embedded
Ray leaves it out of the CPUs it offers, and on an existing cluster the head should leave it out too.

Only public Ray calls: `ray.nodes()` (each node's total resources, alive or not),
`ray.available_resources()` (what is free in the whole cluster) and the runtime context. Ray has no
public call for what is free on each node (ray-project/ray#60134; its maintainers advise a
library's own accounting), so a node's free slots are its total less what our own functions hold
there, and no more than Ray has free in all: what other jobs hold is taken off the nodes with the
fewest free slots, a guess. A function placed by a wrong guess waits for `runtime.place_timeout_s`
and is re-planned.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import ray

from rlhfless.planner.hardware import ModelShape
from rlhfless.planner.placement import ClusterSpec
from rlhfless.runtime.process_env import set_defaults
from rlhfless.runtime_config import RuntimeConfig

Resources = Mapping[str, float]


class ClusterError(RuntimeError):
    """`runtime.ray_address` names no Ray cluster this process can join."""


def start_ray(rt: RuntimeConfig) -> bool:
    """Connect to `rt.ray_address`, or start an embedded Ray on 127.0.0.1; True if we started it.

    The embedded instance offers this machine's cores minus the learner's slot (the driver
    process), so decode functions never oversubscribe the CPUs; on a CUDA run, its GPUs minus the
    learner's (`devices.learner_device`: the last), and none on a CPU run. Either way every function
    starts with `process_env.DEFAULTS` where the driver's environment does not say otherwise.
    """
    if ray.is_initialized():
        return False
    # ray.init sets a SIGTERM handler of its own: a driver's own (`trainer`'s) is put back.
    handler = signal.getsignal(signal.SIGTERM)
    try:
        return _init(rt)
    finally:
        if callable(handler) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, handler)


def _init(rt: RuntimeConfig) -> bool:
    quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
    added = set_defaults(os.environ)  # an embedded Ray's processes inherit the driver's environment
    if rt.ray_address:
        try:
            ray.init(address=rt.ray_address, runtime_env={"env_vars": added} if added else None, **quiet)
        except (ConnectionError, RuntimeError) as err:  # Ray's own retries are spent by now
            raise ClusterError(
                f"runtime.ray_address: got {rt.ray_address!r}, expected the address of a running Ray "
                f"cluster's head (`ray start --head`); Ray said: {str(err).splitlines()[0]}"
            ) from None
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
    nodes: list[dict], driver: str, slot: Resources, held: Mapping[str, int], spare: int
) -> ClusterView:
    """The view from `ray.nodes()` records: alive nodes with a free slot (the driver's always, it
    has the learner's), the driver's first, then by free slots (more first: heavier actors go to
    fuller nodes) and id. A node's free slots are its total less `held` (slots per node our own
    leased functions hold; idle warm ones give way to a request, so they count as free), and all
    nodes together offer no more than `spare` (whole slots Ray has free in the cluster, our idle
    warm functions' included): the rest is held by other jobs, taken off the nodes with the fewest
    free slots (Ray does not say where; see the module docstring)."""
    out = []
    for n in nodes:
        if not n.get("Alive"):
            continue
        node_id = n["NodeID"]
        total = slots_in(n.get("Resources", {}), slot)
        free = max(0, total - int(held.get(node_id, 0)))
        out.append([node_id, n.get("NodeManagerAddress", ""), total, free])
    out.sort(key=lambda n: (n[0] != driver, -n[3], n[0]))
    others = sum(n[3] for n in out) - max(0, spare)
    for n in reversed(out):
        taken = min(n[3], max(0, others))
        n[3], others = n[3] - taken, others - taken
    view = [
        NodeSlots(node_id, address, total + mine, free + mine, mine)
        for node_id, address, total, free in out
        if (mine := node_id == driver) or free > 0
    ]
    view.sort(key=lambda n: (not n.driver, -n.free, n.node_id))
    if not view or not view[0].driver:
        raise RuntimeError(f"the driver's node {driver} is not among Ray's alive nodes")
    return ClusterView(tuple(view))


def read_cluster(slot: Resources, held: Mapping[str, int], idle: int) -> ClusterView:
    """The cluster as Ray reports it now (see `layout`); `idle`: slots our idle warm functions hold."""
    driver = ray.get_runtime_context().get_node_id()
    return layout(ray.nodes(), driver, slot, held, slots_in(ray.available_resources(), slot) + idle)


def await_free(slot: Resources, slots: int, timeout_s: float) -> int:
    """Wait, at most `timeout_s`, until Ray reports `slots` whole slots free; returns how many it
    reports. Resources we give back (a removed placement group, a killed actor) reach Ray's view
    of what is free a moment after the call returns: a plan read in between sees a smaller cluster."""
    deadline = time.monotonic() + timeout_s
    while (free := slots_in(ray.available_resources(), slot)) < slots and time.monotonic() < deadline:
        time.sleep(0.05)
    return free


def free_slots(node_id: str, slot: Resources, held: int) -> int:
    """Slots free on `node_id` now: its total less the `held` slots our own functions (idle warm
    ones included) hold there, and no more than Ray has free in the whole cluster."""
    total = sum(
        slots_in(n.get("Resources", {}), slot) for n in ray.nodes() if n["NodeID"] == node_id and n["Alive"]
    )
    return max(0, min(total - held, slots_in(ray.available_resources(), slot)))
