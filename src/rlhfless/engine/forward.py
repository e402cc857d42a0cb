"""The model forward passes the engine runs: a prefill over rows that share cached prefixes, and
one decode step over the slot cache. Both pass ready 4-D attention masks, so padding and
prefixes are exact for eager and SDPA attention alike; the profiler times these same calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch

from rlhfless.engine.kv import PrefillCache, PrefixKV, SlotCache


def attention_mask_kind(model: torch.nn.Module) -> str:
    """The engine passes ready 4-D masks: boolean for SDPA, additive float for eager attention."""
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    if impl not in ("sdpa", "eager"):
        raise ValueError(
            f"model attention: got {impl!r}, expected 'sdpa' or 'eager' (the engine passes 4-D masks)"
        )
    return impl


def model_mask(mask: torch.Tensor, kind: str, dtype: torch.dtype) -> torch.Tensor:
    """A boolean 4-D mask as `kind` attention takes it: as is for SDPA, additive for eager."""
    if kind == "sdpa":
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, torch.finfo(dtype).min
    )


def chunks(rows: Iterable, length: Callable, tokens: int) -> Iterable[list]:
    """`rows` in order, split into forwards of at most `tokens` padded tokens (at least one row),
    each row `length(row)` tokens long."""
    chunk: list = []
    longest = 0
    for row in rows:
        longest_with = max(longest, length(row))
        if chunk and longest_with * (len(chunk) + 1) > tokens:
            yield chunk
            chunk, longest_with = [], length(row)
        chunk.append(row)
        longest = longest_with
    if chunk:
        yield chunk


def prefill_forward(
    model: torch.nn.Module, rows: Sequence[tuple[list[int], PrefixKV | None]], pad_token_id: int, kind: str
) -> tuple[torch.Tensor, PrefillCache, list[int]]:
    """One forward over rows (tokens, prefix): only the tokens after each prefix are computed.

    Suffixes are left-padded to a common length S and the prefixes right-padded to P; the cache
    returns [prefix block | new tokens] per layer and the mask hides both paddings. Returns the
    last-position logits [R, V], the cache holding the new keys/values [R, H, S, D], and S.
    """
    param = next(model.parameters())
    device = param.device
    prefix_lens = [len(prefix) if prefix is not None else 0 for _, prefix in rows]
    suffix_lens = [len(tokens) - p for (tokens, _), p in zip(rows, prefix_lens, strict=True)]
    n_rows, span, width = len(rows), max(suffix_lens), max(prefix_lens)
    ids = torch.full((n_rows, span), pad_token_id, dtype=torch.long)
    positions = torch.zeros((n_rows, span), dtype=torch.long)
    for r, ((tokens, _), p, s) in enumerate(zip(rows, prefix_lens, suffix_lens, strict=True)):
        ids[r, span - s :] = torch.tensor(tokens[p:])
        positions[r, span - s :] = torch.arange(p, p + s)
    p_t = torch.tensor(prefix_lens)[:, None, None]
    s_t = torch.tensor(suffix_lens)[:, None, None]
    q = torch.arange(span)[None, :, None]
    k_new = torch.arange(span)[None, None, :]
    new_part = ((k_new >= span - s_t) & (k_new <= q)) | (k_new == q)
    if width:
        old_part = torch.arange(width)[None, None, :] < p_t
        mask = torch.cat((old_part.expand(n_rows, span, width), new_part.expand(n_rows, span, span)), dim=2)
        keys, values = [], []
        for layer in range(model.config.num_hidden_layers):
            k_block = v_block = None
            for r, (_, prefix) in enumerate(rows):
                if prefix is None or not len(prefix):
                    continue
                if k_block is None:
                    shape = (n_rows, prefix.keys[layer].shape[0], width, prefix.keys[layer].shape[2])
                    k_block = torch.zeros(shape, dtype=param.dtype, device=device)
                    v_block = torch.zeros(shape, dtype=param.dtype, device=device)
                k_block[r, :, : len(prefix)] = prefix.keys[layer]
                v_block[r, :, : len(prefix)] = prefix.values[layer]
            keys.append(k_block)
            values.append(v_block)
        cache = PrefillCache(keys, values)
    else:
        mask = new_part.expand(n_rows, span, span)
        cache = PrefillCache(None, None)
    mask = model_mask(mask[:, None].to(device), kind, param.dtype)
    out = model(
        input_ids=ids.to(device),
        attention_mask=mask,
        position_ids=positions.to(device),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[:, -1], cache, span


# Decode spans are rounded up to a multiple of this, so a 160-token response repeats 3-4 shapes
# instead of making 160; on this CPU a step's time is unchanged within noise (bench_span.py).
SPAN_QUANTUM = 64


def decode_span(longest: int, quantum: int = SPAN_QUANTUM) -> int:
    """The positions a decode step attends over when its longest sequence holds `longest` tokens
    before the new one: that plus one, rounded up to `quantum` (the mask hides the rest)."""
    return -(-(longest + 1) // quantum) * quantum


def decode_forward(
    model: torch.nn.Module,
    slots: SlotCache,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    kind: str,
    span: int,
) -> torch.Tensor:
    """One decode forward of slots 0..B-1: feed `tokens` [B] at `positions` [B] (< span); logits [B, V]."""
    mask = model_mask(slots.begin_decode(positions, span), kind, slots.dtype)
    out = model(
        input_ids=tokens[:, None],
        attention_mask=mask,
        position_ids=positions[:, None],
        past_key_values=slots,
        use_cache=True,
    )
    return out.logits[:, -1]
