"""Mixed precision for the models that learn or score: their forward passes run under bfloat16
autocast when the run computes in bfloat16 over float32 master weights (`model.compute_dtype`),
and the backward follows the dtypes the forward recorded. Weights, gradients, optimizer states,
log-probs and losses stay float32, as in TRL's and OpenRLHF's bf16 training.

The rollout engines (prefill, decode) stay in the weights' dtype. A bfloat16 engine's logits move
with its batch's shape by far more than float32's, and the sampler's Gumbel-max then flips near-tied
tokens: on the default run, verl and rlhfless sampled 52 of 128 responses alike in bfloat16, against
all of them in float32. A schedule would change samples, which RLHFless promises it never does. So
`model.dtype=auto` is float32 on a GPU as well, where the learner computes in bfloat16 over it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch


def autocast(model: torch.nn.Module, compute_dtype: str) -> contextlib.AbstractContextManager:
    """Autocast to `compute_dtype` over `model`'s forward on its device; nothing to do when its
    weights are already in that dtype. Without autocast's cache of weight casts: one forward pass
    uses each weight once, so the cache reuses nothing and would hold a bfloat16 copy of every
    layer's weights until the pass ends (a layer that the backward recomputes casts afresh)."""
    param = next(model.parameters())
    dtype = getattr(torch, compute_dtype)
    if dtype == param.dtype:
        return contextlib.nullcontext()
    return torch.autocast(param.device.type, dtype=dtype, cache_enabled=False)


@contextlib.contextmanager
def deterministic(device: torch.device) -> Iterator[None]:
    """On a GPU, the learner's passes with deterministic kernels (`torch.use_deterministic_algorithms`):
    gather's backward adds with atomics, and flash and memory-efficient attention's backward split
    their sums racily, so two runs of one schedule would learn weights a rounding apart, and the next
    step's samples would differ (an H200, session 29: over three steps, 68 of 96 samples alike
    between verl and rlhfless, whose schedules differ in no sample). Not `warn_only`: under it
    attention's backward stays racy. A CPU's kernels are deterministic already: nothing changes there."""
    if device.type != "cuda":
        yield
        return
    # torch checks this for cuBLAS; one stream's GEMMs are deterministic under any workspace
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    was, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)
