"""Measure this engine on this machine with dummy batches: the planner's `Profile` table.

Decode: one decode-step forward of `batch` sequences that each hold `context` KV tokens.
Prefill: one forward of a single `tokens`-long prompt. Times are medians over `repeats` runs,
after one warm-up, in milliseconds. A decode point whose KV would pass `kv_budget_bytes` is not
held at all: its time goes on from its batch's last two measured contexts in a straight line, the
planner's own rule past a table's edge. On a CPU the KV is the process's memory: the default
grid's largest point, 64 sequences at 1,024 tokens of SmolLM2-135M, holds 3.0 GB, which took a
first run's driver to 5.25 GB against the 4 GB a process may take.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from functools import partial

import torch

from rlhfless.engine.forward import attention_mask_kind, decode_forward, decode_span, prefill_forward
from rlhfless.engine.kv import SlotCache, kv_layout
from rlhfless.engine.packed import PackedLinears


def median_ms(fn, repeats: int, device: torch.device) -> float:
    """`fn()`'s median wall time over `repeats` calls after one warm-up, in ms, the device's queue
    drained around each call."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def kv_bytes_per_token(model: torch.nn.Module) -> int:
    layers, kv_heads, head_dim = kv_layout(model.config)
    return 2 * layers * kv_heads * head_dim * next(model.parameters()).element_size()


def max_kv_tokens(model: torch.nn.Module, memory_fraction: float = 0.5) -> int:
    """KV tokens that fit in `memory_fraction` of the free device (GPU) or host (CPU) memory."""
    device = next(model.parameters()).device
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(free * memory_fraction) // kv_bytes_per_token(model)


def extended_ms(measured: Sequence[tuple[int, float]], context: int) -> float:
    """A decode step's ms at `context`, on the line through a batch's last two measured
    `(context, ms)` points; a falling line (noise) is taken as flat."""
    (c0, ms0), (c1, ms1) = measured[-2:]
    return ms1 + max((ms1 - ms0) / (c1 - c0), 0.0) * (context - c1)


def position_limit(model: torch.nn.Module) -> int | None:
    """The most positions the model holds (`max_position_embeddings`, GPT-2's `n_positions`), or
    None where its config names none. A model with a position table (GPT-2's 1,024) fails past it."""
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    return int(limit) if isinstance(limit, int) and limit > 0 else None


def measure_profile(
    model: torch.nn.Module,
    *,
    batches: Sequence[int],
    contexts: Sequence[int],
    prefill_tokens: Sequence[int],
    repeats: int = 3,
    memory_fraction: float = 0.5,
    packed_weights: bool = False,
    kv_budget_bytes: int | None = None,
) -> dict:
    """`{"decode": [{"batch", "context", "ms"}], "prefill": [{"tokens", "ms"}], "gpus": 1,
    "max_kv_tokens": K, "extended": [{"batch", "context"}]}`. `packed_weights`: as an engine built
    with it runs its forwards (`Engine`). `kv_budget_bytes` (None: no limit): the most KV a timed
    point may hold; past it a batch's first two contexts are still timed, and its later points
    are `extended` (`extended_ms`), as are contexts past the model's positions (`position_limit`),
    and prefills longer than them are not timed."""
    if repeats < 1:
        raise ValueError(f"repeats: got {repeats}, expected >= 1")
    if kv_budget_bytes is not None and kv_budget_bytes < 1:
        raise ValueError(f"kv_budget_bytes: got {kv_budget_bytes}, expected a positive number of bytes")
    kind = attention_mask_kind(model)
    param = next(model.parameters())
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    token_bytes = kv_bytes_per_token(model)
    limit = position_limit(model) or max(*contexts, *prefill_tokens, 1) + 1
    decode, prefill, extended = [], [], []
    with torch.inference_mode(), PackedLinears(model, packed_weights):
        for batch in batches:
            measured: list[tuple[int, float]] = []
            for context in contexts:
                span = decode_span(context)  # as the engine attends
                over = kv_budget_bytes is not None and batch * span * token_bytes > kv_budget_bytes
                # Past the model's positions no run gets: extended, or timed at the last position
                # where nothing was timed yet (a probe's one context).
                beyond = context >= limit
                if (beyond and measured) or (over and len(measured) >= 2):
                    ms = round(extended_ms(measured, context) if len(measured) >= 2 else measured[-1][1], 4)
                    extended.append({"batch": int(batch), "context": int(context)})
                else:
                    slots = SlotCache.for_model(model)
                    slots.reserve(batch, span)
                    tokens = torch.randint(0, vocab, (batch,), generator=generator).to(param.device)
                    at = min(context, limit - 1)
                    positions = torch.full((batch,), at, dtype=torch.long, device=param.device)
                    step = partial(decode_forward, model, slots, tokens, positions, kind, span)
                    ms = round(median_ms(step, repeats, param.device), 4)
                    measured.append((context, ms))
                decode.append({"batch": int(batch), "context": int(context), "ms": ms})
        within = [n for n in prefill_tokens if n <= limit]
        # Every asked-for prompt past the positions: the longest there is. None asked (the speed
        # probe's decode steps): none timed, where a prefill of every position took minutes.
        for n in within or [limit] * bool(prefill_tokens):
            row = [(torch.randint(0, vocab, (n,), generator=generator).tolist(), None)]
            ms = median_ms(partial(prefill_forward, model, row, 0, kind), repeats, param.device)
            prefill.append({"tokens": int(n), "ms": round(ms, 4)})
    return {
        "decode": decode,
        "prefill": prefill,
        "gpus": 1,
        "max_kv_tokens": max_kv_tokens(model, memory_fraction),
        "extended": extended,
    }
