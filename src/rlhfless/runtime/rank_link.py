"""The driver's line to learner rank 0: the policy's weights after each update, sent tensor by
tensor over a gloo pair of the two processes (`torch.distributed`), straight into the driver's
tensors. (A checkpoint's learner state does not travel: rank 0 writes it, `ElasticLearner._save`.)

Not through Ray's object store: a process that returns an object writes it into the store, and
every page it touched there counts in its resident memory from then on, in new places as the
store fills. Pulled that way, 64 MB at a time, rank 0 of the default run still gained 0.6 GB of
store pages a step (1.25 GB after four: docs/DECISIONS.md). Rank 0 shares the driver's node, so
the pair meets on the driver's address.
"""

from __future__ import annotations

from datetime import timedelta

import ray
import torch
import torch.distributed as dist

TIMEOUT = timedelta(seconds=300)  # a send or receive whose peer hangs (one that dies closes the socket)
DRIVER, RANK0 = 0, 1  # ranks in the pair


def listening(host: str, timeout: timedelta = TIMEOUT) -> dist.TCPStore:
    """A store on `host` listening on a port the system gave it (`.port`). Not a port asked free
    and then bound: another process can take it in between, as a suite run on two workers did
    (EADDRINUSE)."""
    return dist.TCPStore(host, 0, None, is_master=True, timeout=timeout, wait_for_workers=False)


class RankLink:
    """The driver's end: opened with rank 0's `link` (`LearnerRank.link`), then `receive`s what
    a call on rank 0 `send`s."""

    def __init__(self, rank0) -> None:
        host = ray.util.get_node_ip_address()
        self.store = listening(host)
        joined = rank0.link.remote(host, self.store.port)
        self.group = dist.ProcessGroupGloo(self.store, DRIVER, 2, TIMEOUT)
        ray.get(joined)

    def receive(self, sending, tensors: list[torch.Tensor]) -> None:
        """Fill `tensors` (shapes and dtypes as sent) from rank 0, which sends them in the call
        `sending` (an object ref): its failure (rank 0 lost) is raised here."""
        for tag, tensor in enumerate(tensors):
            if tensor.device.type == "cpu" and tensor.is_contiguous():
                self.group.recv([tensor], RANK0, tag).wait()
            else:  # gloo's point-to-point moves CPU tensors
                staged = torch.empty(tensor.shape, dtype=tensor.dtype)
                self.group.recv([staged], RANK0, tag).wait()
                tensor.copy_(staged)
        ray.get(sending)


def join(host: str, port: int) -> dist.ProcessGroupGloo:
    """Rank 0's end of the pair the driver opened at `host`:`port`."""
    store = dist.TCPStore(host, port, 2, is_master=False, timeout=TIMEOUT)
    return dist.ProcessGroupGloo(store, RANK0, 2, TIMEOUT)


def send(group: dist.ProcessGroupGloo, tensors: list[torch.Tensor]) -> None:
    """`tensors` to the driver, in order (CPU copies of those on a GPU)."""
    for tag, tensor in enumerate(tensors):
        group.send([tensor.detach().cpu().contiguous()], DRIVER, tag).wait()
