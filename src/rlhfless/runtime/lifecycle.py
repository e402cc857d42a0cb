"""The function lifecycle on Ray: create each function on the node the plan names, lease it from the
warm pool, make room for it, release it warm or stopped.

A function not colocated with the learner gets hard node affinity (Ray's
`NodeAffinitySchedulingStrategy`) to its plan node and its own resources there; one colocated with
the learner runs on the driver's node with none (the learner's slot, held by this process). When a
new function needs a node's resources and idle warm functions of another shape hold them, those are
stopped first: keep-alive gives way to a request.
"""

from __future__ import annotations

import time

import ray
from ray.exceptions import (
    ActorUnschedulableError,
    OutOfMemoryError,
    RayActorError,
    RayTaskError,
    WorkerCrashedError,
)
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlhfless.config import Config
from rlhfless.devices import resolve_device
from rlhfless.runtime.billing import Invocation, Meter
from rlhfless.runtime.executor import cuda_graphs
from rlhfless.runtime.functions import DecodeFunction, PrepareFunction, PrepSetup
from rlhfless.runtime.pool import FunctionPool, Lease, Shape
from rlhfless.runtime.ray_cluster import ClusterView, free_slots, read_cluster

# The function's process is gone (crashed, killed, its node lost) or can never be placed.
LOST = (RayActorError, OutOfMemoryError, WorkerCrashedError, ActorUnschedulableError)


def gpu_of(function) -> str:
    """Run inside a held function (Ray's `__ray_call__`): the Ray id of the GPU it was given, which
    is its CUDA index in a process of its node that asked for none (`devices.learner_device`)."""
    return ray.get_gpu_ids()[0]


def any_lost(calls: list[ray.ObjectRef]) -> bool:
    """Whether the process of any of these calls' actors died (a failed task is not a loss)."""
    lost = False
    for call in calls:
        try:
            ray.get(call)
        except LOST:
            lost = True
        except RayTaskError:
            pass
    return lost


class Functions:
    """Every started function of the run: the warm pool, and how a new one is created."""

    def __init__(
        self, cfg: Config, tokenizer, has_reference: bool, gpu: bool, driver: str, learner_device: str = "cpu"
    ) -> None:
        """`gpu`: the run's device is CUDA (slots are GPUs); `learner_device`: the learner's slot's
        device on the driver's node, where colocated functions put their models."""
        cfg = resolve_device(cfg)  # as the run resolved it (a no-op then): functions get it concrete
        self.cfg, self.tokenizer, self.has_reference, self.gpu = cfg, tokenizer, has_reference, gpu
        self.learner_device = learner_device
        self.rt = cfg.runtime
        self.driver = driver
        self.slot: dict[str, float] = (
            {"GPU": float(cfg.scheduler.gpus_per_actor)} if gpu else {"CPU": float(self.rt.cpus_per_actor)}
        )
        keep_alive = float("inf") if cfg.scheduler.policy == "verl" else self.rt.keep_alive_s
        self.pool = FunctionPool(self._create, keep_alive)
        # Nodes where Ray did not place a function of ours in time, this step: full, though our
        # accounting cannot see it (another job holds their slots; Ray has no public per-node view).
        self.full: set[str] = set()

    def cluster(self) -> ClusterView:
        """The cluster now, our idle warm functions' slots counted as free (they give way)."""
        self.full = set()
        idle = sum(self._held(self.pool.idle).values())
        return read_cluster(self.slot, self._held(self.pool.leased), idle)

    def free_slots(self, node: str) -> int:
        """Slots free for a new function on `node` now (our idle warm functions hold theirs)."""
        if node in self.full:
            return 0
        held = self._held([*self.pool.leased, *self.pool.idle])
        return free_slots(node, self.slot, held.get(node, 0))

    @staticmethod
    def _held(leases) -> dict[str, int]:
        """Slots per node that these leases hold (each with resources of its own holds one)."""
        out: dict[str, int] = {}
        for lease in leases:
            if lease.units > 0:
                out[lease.shape[2]] = out.get(lease.shape[2], 0) + 1
        return out

    def acquire(
        self,
        meter: Meter,
        name: str,
        function: str,
        colocated: bool,
        node: str,
        units: float,
        now: float,
        kind: str | None = None,
    ) -> tuple[Lease, Invocation]:
        """A lease of a `function` (decode, prepare) on `node` (the driver's when colocated) and its
        open invocation of `kind` (default: the function); warm leases start at once, cold ones
        when their process does (`settle`)."""
        shape: Shape = (function, colocated, self.driver if colocated else node)
        if not colocated and not any(lease.shape == shape for lease in self.pool.idle):
            self._make_room(shape[2], now)
        lease = self.pool.acquire(shape, now)
        resources = dict(self.slot) if colocated or not self.gpu else {"GPU": units}
        inv = meter.open(
            Invocation(
                name,
                kind or function,
                resources,
                units,
                requested=now,
                started=None if lease.cold else now,
                colocated_with="learner" if colocated else None,
                cold=lease.cold,
                node=shape[2],
            )
        )
        lease.units, lease.resources = (0.0 if colocated else units), resources
        return lease, inv

    def prestart(self, function: str, after: str | None = None) -> None:
        """Start a `function` (decode, prepare) on the learner's resources now, before its first
        step: every step uses one there, and none holds resources of its own to bill. `after`:
        the kind of a function pre-started before, whose start this one's waits for (Ray creates
        it once that one's start is ready: a dependency of its creation task)."""
        starting = (x.hello for x in self.pool.idle if x.shape[0] == after and x.hello is not None)
        self.pool.prestart((function, True, self.driver), time.time(), next(starting, None))

    def _make_room(self, node: str, now: float) -> None:
        """Stop an idle warm function on `node` when Ray has no free slot there for a new one."""
        idle = [lease for lease in self.pool.idle if lease.shape[2] == node and lease.units > 0]
        if idle and self.free_slots(node) < 1:
            self.pool.stop_idle(idle[:1], now)  # each holds one slot

    def settle(self, lease: Lease, inv: Invocation) -> None:
        """Fill a cold start's started/ready times and node from the function's own report."""
        if lease.hello is None:
            return
        try:
            hello = ray.get(lease.hello)
            # A pre-started worker process is older than the request: billing starts at the request.
            inv.started, inv.ready = max(inv.requested, hello.started), hello.ready
            inv.node = hello.node
            self.pool.started(lease, hello.ready)
        except LOST:
            inv.started = inv.started or inv.requested
        lease.hello = None

    def placed(self, lease: Lease) -> bool:
        """Whether Ray has placed the function: given it a worker on a node (its cold start may
        still be running), as its `where` answer shows; warm ones have been, and one on the
        learner's resources needs none from Ray. Asked once its placement deadline has passed: a
        function not placed by then marks its node full."""
        colocated = lease.shape[1]
        if lease.hello is None or colocated or ray.wait([lease.where], timeout=0)[0]:
            return True
        self.full.add(lease.shape[2])
        return False

    def release(self, lease: Lease, now: float, keep: bool = True) -> None:
        self.pool.release(lease, now, keep=keep)

    def drop(self, lease: Lease) -> None:
        """A lease whose function died (or was never placed): stopped and forgotten."""
        self.pool.drop(lease)

    def warm(self) -> int:
        """Warm decode functions in the pool with resources of their own."""
        return sum(1 for lease in self.pool.idle if lease.shape[0] == "decode" and lease.units > 0)

    def host_starting_s(self) -> float | None:
        """`FunctionPool.starting_s` of the decode function on the learner's resources."""
        return self.pool.starting_s(("decode", True, self.driver), time.time())

    def close(self) -> None:
        self.pool.close()

    def prep_setup(self) -> PrepSetup:
        """What preparing needs, wherever it runs (the prepare function, a decode function's tail)."""
        cfg = self.cfg
        return PrepSetup(
            cfg.reward,
            cfg.generation.temperature,
            self.tokenizer.pad_token_id,
            cfg.model.compute_dtype,
            gym=cfg.data.source == "reasoning_gym",
        )

    def _create(self, shape: Shape, after: ray.ObjectRef | None = None):
        kind, colocated, node = shape
        options: dict = {
            "max_restarts": 0,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False),
        }
        if colocated:  # runs on the learner's resources, which the driver holds
            options.update(num_cpus=0, num_gpus=0)
        elif self.gpu:
            options.update(num_cpus=0, num_gpus=self.cfg.scheduler.gpus_per_actor)
        else:
            options.update(num_cpus=self.rt.cpus_per_actor)
        cfg, vocab = self.cfg, len(self.tokenizer)
        # Colocated: the learner's device (Ray leaves a process that asks for no GPU every GPU of
        # its node); else the run's, `cuda` being the GPU Ray gave the function.
        device = self.learner_device if colocated else cfg.runtime.device
        if kind == "decode":
            return (
                ray.remote(DecodeFunction)
                .options(**options)
                .remote(
                    cfg.model,
                    vocab,
                    cfg.seed,
                    [self.tokenizer.eos_token_id],
                    self.tokenizer.pad_token_id,
                    cfg.generation.max_running,
                    self.rt.threads_per_actor,
                    device,
                    cuda_graphs=cuda_graphs(cfg, device),
                    packed_weights=cfg.generation.packed_weights,
                    after=after,
                )
            )
        return (
            ray.remote(PrepareFunction)
            .options(**options)
            .remote(
                cfg.model if self.has_reference else None,
                vocab,
                cfg.seed,
                self.prep_setup(),
                self.rt.threads_per_actor,
                device,
                after=after,
            )
        )
