"""One rank of the data-parallel learner: a replica of the policy (and PPO's critic) with its
optimizer, in a Ray function of its own; `dp_learner.ElasticLearner` starts, joins and stops them."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import ray
import torch
import torch.distributed as dist

from rlhfless.config import Config
from rlhfless.models import load_model
from rlhfless.runtime import rank_link
from rlhfless.runtime.data_parallel import DataParallel, backend, broadcast_params, broadcast_state, least
from rlhfless.runtime.executor import LearnerReplica
from rlhfless.runtime.functions import Started, function_setup, started
from rlhfless.runtime.samples import Sample
from rlhfless.runtime.transfer import load_flat_weights, split_state

WEIGHTS = "weights"  # the concurrency group of `take_weights`: a join runs beside it, and stops it


@dataclass(frozen=True)
class Joined:
    """What joining the phase's group moved to this rank: its take of the step's published weights
    before it (seconds, bytes, when it began), and the values rank 0 sent (those some rank had not
    taken: all, or none, or the rest of a take the join stopped) and their seconds."""

    take_s: float
    take_bytes: int
    take_start: float
    sent_values: int
    send_s: float


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
        self.taken = 0  # parameters of the step's published weights held, in order (`take_weights`)
        self.took = (0.0, 0, 0.0)  # the take's seconds, bytes, and when it began
        self.stop_take = threading.Event()  # set by `join`: a take stops, or never begins
        self.taking = threading.Lock()  # held while a take copies
        self.take_over = threading.Event()  # the take has ended (whole, stopped or failed)
        self.ready = time.time()

    def hello(self) -> Started:
        return started(self.begin, self.ready)

    def address(self) -> tuple[str, int]:
        """Where the phase's process group meets: this node, a port free now."""
        return ray.util.get_node_ip_address(), rank_link.free_port()

    def join(self, address: str, port: int, rank: int, width: int) -> Joined:
        """Form the phase's group (gloo on CPUs, NCCL on GPUs); ranks 1.. take rank 0's weights and
        schedule, not its optimizer states (only rank 0 steps). Rank 0's weights are the step's
        published ones, which the other ranks may have taken during generation (`take_weights`):
        a take still running stops once the group has formed, and rank 0 sends only the
        parameters that some rank has not taken (a broadcast is far faster than a fresh process's
        first read of the object store)."""
        url = f"tcp://{address}:{port}"
        dist.init_process_group(
            backend(self.device), init_method=url, rank=rank, world_size=width, timeout=self.timeout
        )
        self.stop_take.set()
        with self.taking:
            held = len(list(self.policy.parameters())) if rank == 0 else self.taken
        self.taken = 0  # the phase's update changes rank 0's weights, not these
        start = time.perf_counter()
        sent = broadcast_params(self.policy, start=least(held, self.device))
        send_s = time.perf_counter() - start if sent else 0.0
        state = broadcast_state(self.phase_state() if rank == 0 else None, device=self.device)
        if rank:
            self.load_phase_state(state)
        self._use(DataParallel(rank, width, self.device))
        took, self.took = self.took, (0.0, 0, 0.0)
        return Joined(*took, sent, send_s)

    @ray.method(concurrency_group=WEIGHTS)
    def take_weights(self, flat: np.ndarray) -> None:
        """The step's published weights (the decode functions' buffer, which rank 0's equal), taken
        while generation runs: to learn ahead with, and so that joining sends fewer. In a thread
        of its own, so that a join need not wait for it (`join` stops it)."""
        try:
            with self.taking:
                if self.stop_take.is_set():
                    return
                began, start = time.time(), time.perf_counter()
                self.taken = load_flat_weights(self.policy, flat, self.stop_take)
                values = sum(p.numel() for p in list(self.policy.parameters())[: self.taken])
                self.took = (time.perf_counter() - start, values * flat.itemsize, began)
        finally:
            self.take_over.set()

    def ahead(
        self, samples: list[Sample], advantages: list[torch.Tensor], ref: list[torch.Tensor] | None
    ) -> tuple[float, float]:
        """`learn_ahead`, timed: when it began and ended (it is billed busy)."""
        self.take_over.wait(self.timeout.total_seconds())
        if self.taken < len(list(self.policy.parameters())):
            raise RuntimeError("ahead: the step's published weights were not taken whole")
        begin = time.time()
        self.learn_ahead(samples, advantages, ref)
        return begin, time.time()

    def updates(self) -> tuple[int, int]:
        """Optimizer steps taken so far, the policy's and the critic's: a call that failed when a
        peer was lost changed nothing if these did not move (rank 0 steps only after the sum)."""
        return self.learner.scheduler.last_epoch, self.critic.updates if self.critic is not None else 0

    def leave(self) -> None:
        """Back to width 1: the phase's group is gone."""
        dist.destroy_process_group()
        self._use(DataParallel())
        self.stop_take.clear()
        self.take_over.clear()

    def _use(self, dp: DataParallel) -> None:
        self.learner.dp = dp
        if self.critic is not None:
            self.critic.dp = dp

    def link(self, host: str, port: int) -> None:
        """Join the driver's line (`rank_link`), over which its weights and state go."""
        self.driver = rank_link.join(host, port)

    def send_weights(self) -> None:
        """The policy's parameters to the driver, in `parameters()` order."""
        rank_link.send(self.driver, list(self.policy.parameters()))

    def state_layout(self) -> tuple[Any, list[tuple[tuple[int, ...], torch.dtype]]]:
        """The learner state for a checkpoint without its tensors (`split_state`), and their shapes
        and dtypes, in the order `send_state` sends them."""
        layout, tensors = split_state(self.state_dict())
        return layout, [(tuple(t.shape), t.dtype) for t in tensors]

    def send_state(self) -> None:
        """The learner state's tensors to the driver (`state_layout`'s order)."""
        rank_link.send(self.driver, split_state(self.state_dict())[1])

    def load(self, flat: np.ndarray, state: dict) -> None:
        """A checkpoint's policy weights and learner state (a resumed run)."""
        load_flat_weights(self.policy, flat)
        self.load_state_dict(state)


def rank_env(mmap_threshold: int) -> dict | None:
    """A rank's runtime_env: glibc's mmap threshold fixed (`runtime.learner_mmap_threshold`), read
    when the process starts. None with 0: the job's environment as it is."""
    return {"env_vars": {"MALLOC_MMAP_THRESHOLD_": str(mmap_threshold)}} if mmap_threshold else None
