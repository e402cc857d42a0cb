"""What the learner publishes to the functions through Ray's object store: the policy's weights, put
once per version, and the step's prefix tree KV, computed on the learner and put once per step.

Functions on the driver's node read both from shared memory (no copy); others get one copy per node.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import ray
import torch

from rlhfless.engine import Engine, PrefixTree
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
    """The step's prefix tree KV: the bundle, its object-store ref, the node each prompt starts
    from (absent: it shares no prefix), and when it was computed and put."""

    bundle: KVBundle
    ref: ray.ObjectRef
    index_of: dict[str, int]
    tokens_computed: int
    start: float
    computed: float
    put: float

    def nbytes(self, uids: list[str]) -> int:
        """Bytes of the levels these prompts start from, each once."""
        return self.bundle.nbytes({self.index_of[u] for u in uids if u in self.index_of})


def publish_prefix_kv(engine: Engine, tree: PrefixTree | None) -> PrefixKV | None:
    """Prefill the plan's prefix tree on `engine` (the learner's, current weights), each level
    from its parent's KV, and put the bundle once for all functions; None without dedup."""
    if tree is None:
        return None
    start = time.time()
    kvs = engine.prefill(tree.tokens, tree.parents)
    computed = time.time()
    bundle = KVBundle.pack(kvs, tree.parents)
    ref = ray.put(bundle)
    return PrefixKV(bundle, ref, dict(tree.node_of), tree.computed_tokens(), start, computed, time.time())
