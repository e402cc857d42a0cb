"""What a learner rank's take of the published weights costs on this machine: the step's weights
copied into a fresh model from Ray's object store (a zero-copy view of its shared memory, as
`LearnerRank.take_weights` gets them), from a file in /dev/shm mapped the same way, and from
private memory, each twice, in one process.

On this machine (a Firecracker VM) a rank's take measured 2-4 s in every run, where the copy
itself takes 0.03 s: a process's first read of an object-store buffer is slow here, a tmpfs
file's is not (cause not found), and every learner rank is a fresh process.

    .venv/bin/python benchmarks/store_read.py
"""

from __future__ import annotations

import tempfile
import time

import numpy as np
import ray
import torch

from rlhfless.config import load_config
from rlhfless.models import load_model, load_tokenizer
from rlhfless.runtime.transfer import flat_weights, load_flat_weights


def main() -> None:
    torch.set_num_threads(1)
    cfg = load_config(preset="default")
    tokenizer = load_tokenizer(cfg.model)
    private = flat_weights(load_model(cfg.model, len(tokenizer), cfg.seed)).copy()
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        stored = ray.get(ray.put(private))  # read-only, in the object store's shared memory
        print(f"{private.nbytes / 2**20:.0f} MiB of weights into a fresh model, seconds (first, again):")
        first = {}
        shm = tempfile.NamedTemporaryFile(dir="/dev/shm", suffix=".weights")
        private.tofile(shm.name)
        mapped = np.memmap(shm.name, dtype=private.dtype, mode="r")
        for name, source in (("object store", stored), ("tmpfs file", mapped), ("private memory", private)):
            model = load_model(cfg.model, len(tokenizer), cfg.seed)
            times = []
            for _ in range(2):
                start = time.perf_counter()
                load_flat_weights(model, source)
                times.append(time.perf_counter() - start)
            first[name] = times[0]
            print(f"  from {name:15s} {times[0]:7.3f} {times[1]:7.3f}")
        for name in ("object store", "tmpfs file"):
            print(f"first copy, {name} / private memory: {first[name] / first['private memory']:.1f}x")
        shm.close()
        assert np.array_equal(flat_weights(model), private)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
