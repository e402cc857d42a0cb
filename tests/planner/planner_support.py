"""Small, hand-checkable profiles and clusters for the planner tests."""

import numpy as np

from rlhfless.planner.placement import ClusterSpec
from rlhfless.planner.profile import Profile


def make_profile(
    step_ms: float = 10.0,
    per_seq_ms: float = 0.0,
    max_kv_tokens: int = 1 << 30,
    prefill_ms_per_token: float = 0.0,
) -> Profile:
    """Decode step = step_ms + per_seq_ms * batch, flat in context; prefill linear in tokens."""
    batch = np.array([1.0, 1000.0])
    return Profile(
        prefill_tokens=np.array([1.0, 1000.0]),
        prefill_ms=np.array([1.0, 1000.0]) * prefill_ms_per_token,
        decode_batch=batch,
        decode_context=np.array([0.0, 10000.0]),
        decode_ms=np.repeat((step_ms + per_seq_ms * batch)[:, None], 2, axis=1),
        max_kv_tokens=max_kv_tokens,
    )


def make_cluster(nodes: int = 2, gpus_per_node: int = 4) -> ClusterSpec:
    return ClusterSpec(nodes=nodes, gpus_per_node=gpus_per_node, model_bytes=10**9, kv_bytes_per_token=1000)
