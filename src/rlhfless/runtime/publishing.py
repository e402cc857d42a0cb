"""What the learner publishes to the functions through Ray's object store: the policy's weights, put
once per version, and the step's unique prefix KV, computed on the learner and put once per step.

Functions on the driver's node read both from shared memory (no copy); others get one copy per node.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import ray
import torch

from rlhfless.engine import Engine
from rlhfless.runtime.samples import StepPrompt
from rlhfless.runtime.transfer import KVBundle, flat_weights


class Weights:
    """The policy's weights in the object store as one flat buffer, put once per version."""

    def __init__(self, policy: torch.nn.Module) -> None:
        self.policy = policy
        self.current: tuple[int, ray.ObjectRef, int] | None = None  # (version, ref, bytes)

    def publish(self, version: int) -> tuple[ray.ObjectRef, int, float]:
        """(ref, bytes, seconds this call spent putting them: 0 when already published)."""
        if self.current is not None and self.current[0] == version:
            return self.current[1], self.current[2], 0.0
        start = time.time()
        flat = flat_weights(self.policy)
        self.current = (version, ray.put(flat), int(flat.nbytes))
        return self.current[1], self.current[2], time.time() - start

    def forget(self) -> None:
        """The policy changed outside `learn` (a checkpoint was loaded): publish again."""
        self.current = None


@dataclass
class PrefixKV:
    """The step's unique prefix KV: the bundle, its object-store ref, each prompt's prefix index,
    and when it was computed and put."""

    bundle: KVBundle
    ref: ray.ObjectRef
    index_of: dict[str, int]
    tokens_computed: int
    start: float
    computed: float
    put: float

    def nbytes(self, uids: list[str]) -> int:
        """Bytes of the prefixes these prompts use."""
        return sum(self.bundle.nbytes(i) for i in {self.index_of[u] for u in uids})


def publish_prefix_kv(engine: Engine, prompts: list[StepPrompt], length: int) -> PrefixKV | None:
    """Prefill every unique `length`-token prefix on `engine` (the learner's, current weights) and
    put the bundle once for all functions; None without dedup (`length` <= 0)."""
    if length <= 0:
        return None
    start = time.time()
    index: dict[tuple[int, ...], int] = {}
    for p in prompts:
        index.setdefault(tuple(p.prompt_ids[:length]), len(index))
    kvs = engine.prefill([list(key) for key in index])
    computed = time.time()
    bundle = KVBundle.pack(kvs)
    ref = ray.put(bundle)
    index_of = {p.uid: index[tuple(p.prompt_ids[:length])] for p in prompts}
    return PrefixKV(bundle, ref, index_of, sum(len(k) for k in index), start, computed, time.time())
