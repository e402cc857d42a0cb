"""Counter-based sampling: a token's randomness is a pure function of who and where it is.

Each sampled token draws one uniform number from a hash of (seed, training step, uid, sample index,
response position) and picks its token by inverse-CDF over the (temperature-scaled, top-p
filtered) distribution. No generator state is carried, so a sequence gets the same tokens in any
batch, on any actor, in any order, and after being cut and resumed elsewhere.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one batch of responses. Greedy (argmax) when temperature == 0."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: got {self.max_new_tokens}, expected >= 1")
        if self.temperature < 0:
            raise ValueError(f"temperature: got {self.temperature}, expected >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: got {self.top_p}, expected in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _splitmix64_array(x: np.ndarray) -> np.ndarray:
    """Vectorised `_splitmix64` over uint64 (numpy wraps on overflow, as the hash needs)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def sequence_key(seed: int, step: int, uid: str, sample: int) -> int:
    """The 64-bit key of one sequence; `uid` is hashed with BLAKE2 (Python's `hash` is salted)."""
    uid_hash = int.from_bytes(hashlib.blake2b(uid.encode(), digest_size=8).digest(), "little")
    key = _splitmix64(seed & _MASK64)
    for part in (step, uid_hash, sample):
        key = _splitmix64(key ^ (part & _MASK64))
    return key


def uniforms(keys: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """One float64 in [0, 1) per (sequence key, response position)."""
    h = _splitmix64_array(keys.astype(np.uint64) ^ positions.astype(np.uint64))
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, u: np.ndarray
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens [B] and their log-probs [B] from logits [B, V] and one uniform per row.

    The log-prob is that of the sampled token under softmax(logits / temperature), before top-p
    truncation (temperature 1 when greedy): what the behaviour policy's temperature implies.
    """
    logits = logits.float()
    if params.greedy:
        logp = torch.log_softmax(logits, dim=-1)
        tokens = logp.argmax(dim=-1)
        return tokens, logp.gather(-1, tokens[:, None])[:, 0]
    logp = torch.log_softmax(logits / params.temperature, dim=-1)
    target = torch.from_numpy(u).to(logp.device)[:, None]
    if params.top_p < 1:
        sorted_logp, order = torch.sort(logp, dim=-1, descending=True, stable=True)
        probs = sorted_logp.double().exp()
        before = torch.cumsum(probs, dim=-1) - probs
        probs = torch.where(before < params.top_p, probs, torch.zeros_like(probs))
    else:
        order = None
        probs = logp.double().exp()
    cdf = torch.cumsum(probs, dim=-1)
    picked = torch.searchsorted(cdf, target * cdf[:, -1:], right=True).clamp_(max=cdf.shape[-1] - 1)
    tokens = (picked if order is None else order.gather(-1, picked))[:, 0]
    return tokens, logp.gather(-1, tokens[:, None])[:, 0]
