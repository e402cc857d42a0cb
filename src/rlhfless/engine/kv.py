"""KV caches as plain per-layer tensors: transferable prefixes and the engine's slot buffers.

The Hugging Face attention layers only call `cache.update(key, value, layer_idx)` and use what it
returns, so the engine passes its own small cache objects and a ready-made 4-D attention mask
instead of a `DynamicCache`. That lets sequences of different lengths share one padded buffer,
join and leave it in place, and start from a prefix computed elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class StaleCacheError(ValueError):
    """A KV cache computed with other weights than the engine holds now."""


@dataclass
class PrefixKV:
    """The KV cache of `token_ids` under weights `weight_version`.

    `keys[l]` and `values[l]` are [kv_heads, len(token_ids), head_dim] for layer l, in the model's
    dtype. Plain tensors, so it pickles (Ray object store) and moves with `.to(device)`.
    """

    token_ids: list[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    weight_version: int

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        for tensor in (*self.keys, *self.values):
            if tensor.dim() != 3 or tensor.shape[1] != n:
                raise ValueError(f"keys/values: got shape {tuple(tensor.shape)}, expected [heads, {n}, dim]")

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def truncated(self, n: int) -> PrefixKV:
        """The cache of the first n tokens (views, no copy)."""
        return PrefixKV(
            self.token_ids[:n],
            [k[:, :n] for k in self.keys],
            [v[:, :n] for v in self.values],
            self.weight_version,
        )

    def to(self, device: torch.device | str) -> PrefixKV:
        return PrefixKV(
            list(self.token_ids),
            [k.to(device) for k in self.keys],
            [v.to(device) for v in self.values],
            self.weight_version,
        )

    def __getstate__(self) -> dict:
        # Views (from `truncated`) would pickle their whole storage: store compact copies.
        return {
            "token_ids": list(self.token_ids),
            "keys": [k.contiguous().clone() for k in self.keys],
            "values": [v.contiguous().clone() for v in self.values],
            "weight_version": self.weight_version,
        }

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)


class PrefillCache:
    """Cache for one prefill forward: rows' prefix KV [R, H, P, D] followed by the new tokens.

    Records the new keys/values so the engine can copy them into its slots afterwards.
    """

    def __init__(self, prefix_keys: list[torch.Tensor] | None, prefix_values: list[torch.Tensor] | None):
        self.prefix_keys = prefix_keys
        self.prefix_values = prefix_values
        self.new_keys: list[torch.Tensor] = []
        self.new_values: list[torch.Tensor] = []

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        self.new_keys.append(key)
        self.new_values.append(value)
        if self.prefix_keys is None:
            return key, value
        return (
            torch.cat((self.prefix_keys[layer_idx], key), dim=2),
            torch.cat((self.prefix_values[layer_idx], value), dim=2),
        )


def kv_layout(config) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of a Hugging Face causal LM's config; KV heads are the
    attention heads where it has no grouped-query count."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return config.num_hidden_layers, kv_heads, head_dim


class SlotCache:
    """Per-layer buffers [slots, kv_heads, capacity, head_dim]; slot i holds running sequence i.

    A decode step writes each row's new key at that row's own length and attends over the first
    `max(length) + 1` positions; the mask hides each row's unused tail. Buffers grow on demand.
    """

    def __init__(
        self, n_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device, grow: int = 128
    ):
        self.n_layers, self.kv_heads, self.head_dim = n_layers, kv_heads, head_dim
        self.dtype, self.device, self.grow = dtype, torch.device(device), grow
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.slots = 0
        self.capacity = 0
        self.version = 0  # counts reallocations: a CUDA graph holds the buffers' addresses
        self._rows: torch.Tensor | None = None
        self._positions: torch.Tensor | None = None
        self._span = 0

    @classmethod
    def for_model(cls, model: torch.nn.Module) -> SlotCache:
        """Empty slots shaped for `model`'s KV (`kv_layout`), in its parameters' dtype and device."""
        param = next(model.parameters())
        return cls(*kv_layout(model.config), param.dtype, param.device)

    def reserve(self, slots: int, tokens: int) -> None:
        """Make room for `slots` sequences of up to `tokens` tokens, keeping what is stored."""
        if slots <= self.slots and tokens <= self.capacity:
            return
        new_slots = max(slots, self.slots)
        new_capacity = max(self.capacity, -(-tokens // self.grow) * self.grow)
        shape = (new_slots, self.kv_heads, new_capacity, self.head_dim)
        for store in (self.keys, self.values):
            for layer, old in enumerate(store):
                fresh = torch.zeros(shape, dtype=self.dtype, device=self.device)
                fresh[: old.shape[0], :, : old.shape[2]] = old
                store[layer] = fresh
            while len(store) < self.n_layers:
                store.append(torch.zeros(shape, dtype=self.dtype, device=self.device))
        self.slots, self.capacity = new_slots, new_capacity
        self.version += 1

    def write(self, slot: int, keys: list[torch.Tensor], values: list[torch.Tensor], start: int = 0) -> None:
        """Store per-layer [H, n, D] tensors at positions start..start+n of `slot`."""
        n = keys[0].shape[1]
        for layer in range(self.n_layers):
            self.keys[layer][slot, :, start : start + n] = keys[layer]
            self.values[layer][slot, :, start : start + n] = values[layer]

    def read(self, slot: int, n: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of the first n positions of `slot`, per layer [H, n, D]."""
        return (
            [k[slot, :, :n].clone() for k in self.keys],
            [v[slot, :, :n].clone() for v in self.values],
        )

    def move(self, src: int, dst: int, n: int) -> None:
        for store in (self.keys, self.values):
            for buf in store:
                buf[dst, :, :n] = buf[src, :, :n]

    def begin_decode(self, positions: torch.Tensor, span: int) -> torch.Tensor:
        """Prepare a decode step of rows 0..B-1 writing at `positions` [B] (all < span); returns the bool mask."""
        batch = positions.shape[0]
        self._rows = torch.arange(batch, device=self.device)
        self._positions = positions
        self._span = span
        span = torch.arange(self._span, device=self.device)
        return (span[None, :] <= positions[:, None])[:, None, None, :]

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        batch = key.shape[0]
        k_buf, v_buf = self.keys[layer_idx], self.values[layer_idx]
        k_buf[self._rows, :, self._positions] = key[:, :, 0]
        v_buf[self._rows, :, self._positions] = value[:, :, 0]
        return k_buf[:batch, :, : self._span], v_buf[:batch, :, : self._span]
