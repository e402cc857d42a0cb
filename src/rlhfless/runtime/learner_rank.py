"""One rank of the data-parallel learner: a replica of the policy (and PPO's critic) with its
optimizer, in a Ray function of its own; `dp_learner.ElasticLearner` starts, joins and stops them."""

from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
import ray
import torch
import torch.distributed as dist

from rlhfless.config import Config
from rlhfless.models import load_model
from rlhfless.runtime import rank_link
from rlhfless.runtime.data_parallel import DataParallel, backend, broadcast_params, broadcast_state, everyone
from rlhfless.runtime.executor import LearnerReplica
from rlhfless.runtime.functions import Started, function_setup, started
from rlhfless.runtime.samples import Sample
from rlhfless.runtime.transfer import load_flat_weights


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
        self.published = False  # holds the step's published weights (`take_weights`), unjoined
        self.store: dist.TCPStore | None = None  # rank 0's, where the phase's group meets (`address`)
        self.ready = time.time()

    def hello(self) -> Started:
        return started(self.begin, self.ready)

    def address(self) -> tuple[str, int]:
        """Where the phase's process group meets (this rank 0's store, kept for its `join`)."""
        self.store = rank_link.listening(ray.util.get_node_ip_address(), self.timeout)
        return self.store.host, self.store.port

    def join(self, address: str, port: int, rank: int, width: int) -> bool:
        """Form the phase's group (gloo on CPUs, NCCL on GPUs); ranks 1.. take rank 0's weights and
        schedule, not its optimizer states (only rank 0 steps). Rank 0's weights are the step's
        published ones, so when every other rank took those already (`take_weights`, during
        generation) none is sent. Whether they were sent."""
        store = (
            self.store if rank == 0 else dist.TCPStore(address, port, is_master=False, timeout=self.timeout)
        )
        dist.init_process_group(
            backend(self.device), store=store, rank=rank, world_size=width, timeout=self.timeout
        )
        send = not everyone(rank == 0 or self.published, self.device)
        self.published = False  # the phase's update changes rank 0's weights, not these
        if send:
            broadcast_params(self.policy)
        state = broadcast_state(self.phase_state() if rank == 0 else None, device=self.device)
        if rank:
            self.load_phase_state(state)
        self._use(DataParallel(rank, width, self.device))
        return send

    def take_weights(self, flat: np.ndarray) -> tuple[float, int]:
        """The step's published weights (the decode functions' buffer, which rank 0's equal), taken
        while generation runs: to learn ahead with, and so that joining sends none. The seconds
        it took and the bytes (the step's transfers record them)."""
        start = time.perf_counter()
        load_flat_weights(self.policy, flat)
        self.published = True
        return time.perf_counter() - start, int(flat.nbytes)

    def ahead(
        self, samples: list[Sample], advantages: list[torch.Tensor], ref: list[torch.Tensor] | None
    ) -> tuple[float, float]:
        """`learn_ahead`, timed: when it began and ended (it is billed busy)."""
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

    def load(self, flat: np.ndarray, path: str) -> int:
        """A checkpoint's policy weights, and its learner state read from `path` (a resumed run);
        the state's weight version."""
        load_flat_weights(self.policy, flat)
        return self.load_state(path)


def rank_env(mmap_threshold: int) -> dict | None:
    """A rank's runtime_env: glibc's mmap threshold fixed (`runtime.learner_mmap_threshold`), read
    when the process starts. None with 0: the job's environment as it is."""
    return {"env_vars": {"MALLOC_MMAP_THRESHOLD_": str(mmap_threshold)}} if mmap_threshold else None
