"""Counter-based sampling: a token's randomness is a pure function of who and where it is.

Each sampled token takes Gumbel noise over the vocabulary from a generator seeded by a hash of
(seed, training step, uid, sample index, response position) and picks argmax(log-probs + noise)
(the Gumbel-max trick: an exact sample of the tempered, top-p filtered distribution). No generator
state is carried, so a sequence gets the same tokens in any batch, on any actor of one device type,
in any order, and after being cut and resumed elsewhere. Gumbel-max rather than inverse-CDF
sampling because a tiny change of the logits (another batch shape) flips the token only when the
two best noisy scores nearly tie, whereas a CDF sums the changes of every token in front of the
sampled one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

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


def sequence_key(seed: int, step: int, uid: str, sample: int) -> int:
    """The 64-bit key of one sequence; `uid` is hashed with BLAKE2 (Python's `hash` is salted)."""
    uid_hash = int.from_bytes(hashlib.blake2b(uid.encode(), digest_size=8).digest(), "little")
    key = _splitmix64(seed & _MASK64)
    for part in (step, uid_hash, sample):
        key = _splitmix64(key ^ (part & _MASK64))
    return key


def token_seed(key: int, position: int) -> int:
    """The generator seed of the token at response `position` of the sequence with `key`."""
    return _splitmix64(key ^ position)


def gumbel_noise(seeds: list[int], vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[len(seeds), vocab] float32 standard Gumbel noise, row i a pure function of seeds[i].

    Drawn on `device` by its own generator type (CPU: Mersenne Twister, CUDA: Philox), so the
    numbers agree between actors of the same device type, not between a CPU and a GPU actor.
    """
    noise = torch.empty(len(seeds), vocab, device=device)
    generator = torch.Generator(device=device)
    for row, seed in zip(noise, seeds, strict=True):
        generator.manual_seed(seed)
        torch.rand(vocab, generator=generator, out=row)
    return noise.log_().neg_().log_().neg_()


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, seeds: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens [B] and their log-probs [B] from logits [B, V] and one seed per row (see `token_seed`).

    The log-prob is that of the sampled token under softmax(logits / temperature), before top-p
    truncation (temperature 1 when greedy): what the behaviour policy's temperature implies.
    """
    logits = logits.float()
    if params.greedy:
        logp = torch.log_softmax(logits, dim=-1)
        tokens = logp.argmax(dim=-1)
        return tokens, logp.gather(-1, tokens[:, None])[:, 0]
    logp = torch.log_softmax(logits / params.temperature, dim=-1)
    scores = logp
    if params.top_p < 1:
        sorted_logp, order = torch.sort(logp, dim=-1, descending=True, stable=True)
        probs = sorted_logp.exp()
        outside = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p
        scores = logp.masked_fill(torch.zeros_like(outside).scatter_(-1, order, outside), float("-inf"))
    noise = gumbel_noise(seeds, logits.shape[-1], logits.device)
    tokens = (scores + noise).argmax(dim=-1)
    return tokens, logp.gather(-1, tokens[:, None])[:, 0]
