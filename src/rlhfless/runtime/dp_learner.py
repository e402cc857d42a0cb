"""The elastic data-parallel learner on Ray: one function per slot, joined by `torch.distributed`.

Rank 0 lives for the whole run on the learner's slot (colocated with the driver, which waits
while it works); it alone owns the optimizer states and steps, and checkpoints read them from it.
Each learning phase takes the planner's width (`planner.learning.learner_width`): ranks 1.. start
cold on the slots free once generation ends (one placement group: all of them or none), requested
one measured rank start before generation's forecast end so their start overlaps its tail
(`planner.learning.rank_start_delay`). They get rank 0's weights and schedule over the phase's
process group, compute their share of the gradients, which reduces per optimizer step sum on
rank 0 (`data_parallel`: gloo on CPUs, NCCL on GPUs; not sharded with FSDP2, docs/DECISIONS.md),
and are stopped when the phase ends. Each rank is billed per slot from its start to its stop;
rank 0 through the learner, whose slot is billed the whole step. After each update the driver
loads rank 0's weights through the object store, 64 MB buckets at a time: its engine prefills
with them, and checkpoints save them (and rank 0's optimizer states, pulled the same way).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

import numpy as np
import ray
import torch
import torch.distributed as dist
from ray.exceptions import RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from rlhfless.config import Config
from rlhfless.devices import resolve_device
from rlhfless.models import load_model
from rlhfless.planner.learning import learner_width
from rlhfless.runtime.billing import Invocation, Meter
from rlhfless.runtime.data_parallel import DataParallel, backend, broadcast_params, broadcast_state
from rlhfless.runtime.executor import LearnerReplica, LearnerSide
from rlhfless.runtime.functions import Started, function_setup, started
from rlhfless.runtime.lifecycle import LOST, Functions
from rlhfless.runtime.transfer import (
    BUCKET_ELEMENTS,
    ShippedTensor,
    buckets,
    flat_weights,
    from_numpy,
    join_state,
    landed,
    load_flat_weights,
    ship,
    split_state,
    to_numpy,
)


class LearnerRank(LearnerReplica):
    """One rank: a replica of the policy (and PPO's critic) with its optimizer, in its own process."""

    def __init__(self, cfg: Config, vocab_size: int, pad_id: int, device: str) -> None:
        """`device`: the run's (`runtime.device`), as this process sees it: rank 0 the learner's
        GPU on the driver's node, ranks 1.. the one Ray gave them (their `cuda`)."""
        self.begin = function_setup(cfg.runtime.threads_per_actor)
        self.device = torch.device(device)
        if self.device.type == "cuda":
            if self.device.index is None:  # the GPU Ray gave this process
                self.device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(self.device)  # NCCL's collectives of objects use the current GPU
        super().__init__(cfg, load_model(cfg.model, vocab_size, cfg.seed, device).train(), pad_id)
        self.timeout = timedelta(seconds=cfg.runtime.place_timeout_s)
        self.ready = time.time()

    def hello(self) -> Started:
        return started(self.begin, self.ready)

    def address(self) -> tuple[str, int]:
        """Where the phase's process group meets: this node, a port free now."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def join(self, address: str, port: int, rank: int, width: int) -> None:
        """Form the phase's group (gloo on CPUs, NCCL on GPUs); ranks 1.. take rank 0's weights and
        schedule, not its optimizer states (only rank 0 steps)."""
        url = f"tcp://{address}:{port}"
        dist.init_process_group(
            backend(self.device), init_method=url, rank=rank, world_size=width, timeout=self.timeout
        )
        broadcast_params(self.policy)
        state = broadcast_state(self.phase_state() if rank == 0 else None, device=self.device)
        if rank:
            self.load_phase_state(state)
        self._use(DataParallel(rank, width, self.device))

    def updates(self) -> tuple[int, int]:
        """Optimizer steps taken so far, the policy's and the critic's: a call that failed when a
        peer was lost changed nothing if these did not move (rank 0 steps only after the sum)."""
        return self.learner.scheduler.last_epoch, self.critic.updates if self.critic is not None else 0

    def leave(self) -> None:
        """Back to width 1: the phase's group is gone."""
        dist.destroy_process_group()
        self._use(DataParallel())

    def _use(self, dp: DataParallel) -> None:
        self.learner.dp = dp
        if self.critic is not None:
            self.critic.dp = dp

    def weight_bucket(self, k: int, elements: int) -> list[np.ndarray]:
        """Bucket `k` (`transfer.buckets` of `elements`) of the policy's parameters, as numpy views
        of them: Ray copies them straight into the object store, no flat copy first."""
        return [to_numpy(p) for p in buckets(list(self.policy.parameters()), elements)[k]]

    def state_layout(self, elements: int) -> tuple[Any, int]:
        """The learner state for a checkpoint without its tensors (`split_state`), and how many
        buckets of `elements` they make."""
        layout, tensors = split_state(self.state_dict())
        return layout, len(buckets(tensors, elements))

    def state_bucket(self, k: int, elements: int) -> list[ShippedTensor]:
        """Bucket `k` of the learner state's tensors (`state_layout`'s order)."""
        return [ship(t) for t in buckets(split_state(self.state_dict())[1], elements)[k]]

    def load(self, flat: np.ndarray, state: dict) -> None:
        """A checkpoint's policy weights and learner state (a resumed run)."""
        load_flat_weights(self.policy, flat)
        self.load_state_dict(state)


class ElasticLearner(LearnerSide):
    """The driver's side: the policy its engine prefills with, rank 0, and the phase's ranks.
    The verbs of every `LearnerSide`, run on every rank, plus `widen` and `narrow` around the phase."""

    def __init__(self, cfg: Config, policy: torch.nn.Module, tokenizer, functions: Functions) -> None:
        cfg = resolve_device(cfg)  # as the run resolved it (a no-op then): the ranks get it concrete
        super().__init__(cfg, policy, tokenizer)
        self.functions = functions
        self.rank_args = (cfg, len(tokenizer), tokenizer.pad_token_id)
        colocated = NodeAffinitySchedulingStrategy(functions.driver, soft=False)
        # On the learner's slot, which the driver holds: on its GPU, the policy's own.
        device = str(next(policy.parameters()).device)
        self.rank0 = self._create(device, num_cpus=0, num_gpus=0, scheduling_strategy=colocated)
        self.ranks = [self.rank0]
        self.invocations: list[Invocation] = []  # the open phase's, one per rank
        self.group = None  # the open (or prestarted) phase's placement group
        self.phase: dict[str, float] = {}
        self.rank_starts: list[float] = []  # the last phases': request to every rank joined
        self.opened = False  # a learning phase is open (between `widen` and `narrow`)
        self.pull_elements = BUCKET_ELEMENTS  # what one pull from rank 0 carries at most

    def _create(self, device: str, **options):
        return (
            ray.remote(LearnerRank)
            .options(max_restarts=0, runtime_env=rank_env(self.cfg), **options)
            .remote(*self.rank_args, device)
        )

    def prestart(self, meter: Meter, held_slots: int, groups: int, now: float) -> None:
        """Start the coming phase's ranks now, on the slots free now, so that their cold start
        runs during generation's tail (`planner.learning.rank_start_delay` says when). They are
        billed from their start, as any function holding a slot."""
        if not self.opened and self.group is None:
            self._launch(meter, self._width(held_slots, groups), now)

    def widen(self, meter: Meter, groups: int, held_slots: int, now: float) -> None:
        """Open the learning phase (once a step) on the planner's width: rank 0, and the ranks
        `prestart` started, or else as many as are free now (`held_slots`: slots our own decode
        functions still hold), all joined in one process group."""
        if self.opened:
            return
        self.opened = True
        if self.group is None:
            self._launch(meter, self._width(held_slots, groups), now)
        rank0 = Invocation(
            "learner-0",
            "learner",
            dict(self.functions.slot),
            0.0,
            now,
            now,
            now,
            colocated_with="learner",
            node=self.functions.driver,
        )
        self.invocations.insert(0, meter.open(rank0))
        width = self._join() if self.group is not None else 1
        self.phase = {
            "learner/width": float(width),
            "time/learner_start": time.time() - now,
            "faults/learner": 0.0,
        }

    def _width(self, held_slots: int, groups: int) -> int:
        view = self.functions.cluster()
        idle = sum(1 for lease in self.functions.pool.idle if lease.units > 0)
        free = sum(n.total for n in view.nodes) - held_slots - idle
        return learner_width(self.cfg.runtime.learner_width, free, groups)

    def _launch(self, meter: Meter, width: int, now: float) -> None:
        """Request ranks 1.. of `width` on one placement group (all placed or none), without
        waiting: their processes start while the driver goes on."""
        if width < 2:
            return
        slot, units = dict(self.functions.slot), float(self.cfg.scheduler.gpus_per_actor)
        self.group = placement_group([slot] * (width - 1), strategy="PACK")
        resources = {"num_cpus": 0, "num_gpus": units} if "GPU" in slot else {"num_cpus": slot["CPU"]}
        for r in range(1, width):
            strategy = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=r - 1)
            self.ranks.append(
                self._create(self.cfg.runtime.device, scheduling_strategy=strategy, **resources)
            )
            inv = Invocation(
                f"learner-{r}", "learner", slot, units, requested=now, cold=True, phase="learning"
            )
            self.invocations.append(meter.open(inv))

    def _join(self) -> int:
        """Ranks 1.. placed and started, joined with rank 0; the width got (1 when Ray could not
        place them in `runtime.place_timeout_s`: their slots were taken)."""
        extra = self.invocations[1:]
        waited = time.time() - extra[0].requested
        if not self.group.wait(max(0.0, self.cfg.runtime.place_timeout_s - waited)):
            for rank in self.ranks[1:]:
                ray.kill(rank)
            remove_placement_group(self.group)
            for inv in extra:  # never started: not billed
                inv.released = time.time()
            self.ranks, self.invocations, self.group = [self.rank0], self.invocations[:1], None
            return 1
        hellos = ray.get([rank.hello.remote() for rank in self.ranks[1:]])
        for inv, hello in zip(extra, hellos, strict=True):
            inv.started, inv.ready, inv.node = max(inv.requested, hello.started), hello.ready, hello.node
        joining = time.time()
        address, port = ray.get(self.rank0.address.remote())
        width = len(self.ranks)
        ray.get([rank.join.remote(address, port, r, width) for r, rank in enumerate(self.ranks)])
        ready = max(hello.ready for hello in hellos)
        self.rank_starts = [
            *self.rank_starts[-2:],
            ready - extra[0].requested + time.time() - max(joining, ready),
        ]
        return width

    @property
    def rank_start_s(self) -> float | None:
        """The longest of the last three phases' rank starts (request to joined), or None before
        any: learning that waits for a rank costs every slot of the step, a rank started early only
        its own."""
        return max(self.rank_starts) if self.rank_starts else None

    def narrow(self, now: float) -> None:
        """Close the learning phase: ranks 1.. stopped and released, rank 0 alone again."""
        if len(self.ranks) > 1:
            ray.get([rank.leave.remote() for rank in self.ranks])
            for rank in self.ranks[1:]:
                ray.kill(rank)
            remove_placement_group(self.group)
        for inv in self.invocations:
            inv.released = now
        self.ranks, self.invocations, self.group, self.opened = [self.rank0], [], None, False

    def _run(self, method: str, *args):
        """`method` on every rank of the phase (the args put once), busy while it runs; rank 0's
        result. A lost rank beyond rank 0 costs the phase its width, not the step (`_lost_ranks`)."""
        refs = [ray.put(a) for a in args]
        before = ray.get(self.rank0.updates.remote()) if len(self.ranks) > 1 else None
        with ExitStack() as busy:
            for inv in self.invocations:
                busy.enter_context(inv.busy_while())
            calls = [getattr(rank, method).remote(*refs) for rank in self.ranks]
            try:
                return ray.get(calls)[0]
            except (*LOST, RayTaskError):
                if before is None or not _any_lost(calls[1:]):
                    raise
            try:
                done = ray.get(calls[0])  # rank 0 finished before the peer was lost
            except RayTaskError:  # it failed in a collective with the lost peer
                done = None
        self._lost_ranks()
        if done is not None:
            return done
        if ray.get(self.rank0.updates.remote()) != before:
            raise RuntimeError(
                f"learning: a learner rank was lost during {method} after rank 0 had stepped; "
                "expected to redo it on rank 0 alone, so resume the run from its last checkpoint"
            )
        return self._run(method, *args)

    def _lost_ranks(self) -> None:
        """A rank beyond rank 0 died (its process, its node): every rank but rank 0 is stopped and
        released, rank 0 leaves the broken group, and the phase goes on at width 1."""
        now = time.time()
        for inv in self.invocations[1:]:
            inv.released = now
            inv.event(now, "fault", 1)
        for rank in self.ranks[1:]:
            ray.kill(rank)
        remove_placement_group(self.group)
        ray.get(self.rank0.leave.remote())
        self.ranks, self.invocations, self.group = [self.rank0], self.invocations[:1], None
        self.phase["learner/width"] = 1.0
        self.phase["faults/learner"] = self.phase.get("faults/learner", 0.0) + 1

    def _phase(self) -> dict:
        return self.phase

    def _synced(self) -> dict:
        """The driver's policy (its engine's, the checkpoints') loaded from rank 0, a bucket at a
        time (`_pull`)."""
        start = time.perf_counter()
        parts = buckets(list(self.policy.parameters()), self.pull_elements)
        with torch.no_grad():
            for bucket, arrays in zip(parts, self._pull("weight_bucket", len(parts)), strict=True):
                for p, array in zip(bucket, arrays, strict=True):
                    p.copy_(from_numpy(array, p.dtype).view_as(p))
        return {"time/learner_sync": time.perf_counter() - start}

    def _state(self) -> dict:
        """Rank 0's learner state, its tensors copied into this process a bucket at a time."""
        layout, count = ray.get(self.rank0.state_layout.remote(self.pull_elements))
        tensors = [landed(t) for part in self._pull("state_bucket", count) for t in part]
        return join_state(layout, tensors)

    def _pull(self, method: str, count: int) -> Iterator[list]:
        """Rank 0's buckets 0..count-1 by `method`, each requested as the one before it arrives:
        at most three buckets (192 MB) are in the object store at once. Rank 0 writes every object
        it returns there, and the pages it touched count in its resident memory from then on: a
        whole state or weight vector at a time, in new places as the store fills, was up to a
        gigabyte more of it per step."""
        call = getattr(self.rank0, method)
        ref = call.remote(0, self.pull_elements) if count else None
        for k in range(count):
            ahead = call.remote(k + 1, self.pull_elements) if k + 1 < count else None
            yield ray.get(ref)
            ref = ahead

    def _restore(self, state: dict) -> None:
        """A resumed run: rank 0 takes the checkpoint's policy (already in the driver's) and state."""
        ray.get(self.rank0.load.remote(flat_weights(self.policy), state))

    def close(self) -> None:
        """Stop every rank, without waiting on a phase an error may have left in a collective."""
        for rank in self.ranks:
            ray.kill(rank)
        if self.group is not None:
            remove_placement_group(self.group)


def rank_env(cfg: Config) -> dict | None:
    """The ranks' runtime_env: glibc's mmap threshold fixed (`runtime.learner_mmap_threshold`), read
    when the process starts. None with 0: the job's environment as it is."""
    threshold = cfg.runtime.learner_mmap_threshold
    return {"env_vars": {"MALLOC_MMAP_THRESHOLD_": str(threshold)}} if threshold else None


def _any_lost(calls: list) -> bool:
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
