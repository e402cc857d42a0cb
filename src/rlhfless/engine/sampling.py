"""Counter-based sampling: a token's randomness is a pure function of who and where it is.

Each sampled token takes Gumbel noise over the vocabulary from a counter-based hash of
(seed, training step, uid, sample index, response position, token id), computed in int64 tensor
ops, and picks argmax(log-probs + noise) (the Gumbel-max trick: an exact sample of the tempered,
top-p filtered distribution). No generator state is carried, so a sequence gets the same noise bits
in any batch, on any device (CPU or CUDA), in any order, and after being cut and resumed elsewhere. Gumbel-max rather than inverse-CDF
sampling because a tiny change of the logits (another batch shape) flips the token only when the
two best noisy scores nearly tie, whereas a CDF sums the changes of every token in front of the
sampled one.
"""

from __future__ import annotations

import hashlib
import math
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
    """The noise seed of the token at response `position` of the sequence with `key`."""
    return _splitmix64(key ^ position)


def _signed(c: int) -> int:
    """A 64-bit constant as the int64 that has its bits."""
    return c - (1 << 64) if c >= 1 << 63 else c


def _shift_right(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's `>>` is arithmetic: it copies the sign bit)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _splitmix64_tensor(x: torch.Tensor) -> torch.Tensor:
    """`_splitmix64` elementwise on int64 tensors; products wrap modulo 2**64 as on any device.
    In place on a copy, with one scratch tensor: over a vocabulary-wide batch, fresh tensors for
    every operation cost more than the arithmetic."""
    x = x + _signed(0x9E3779B97F4A7C15)
    scratch = torch.empty_like(x)
    for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, None)):
        torch.bitwise_right_shift(x, shift, out=scratch)
        x.bitwise_xor_(scratch.bitwise_and_((1 << (64 - shift)) - 1))
        if factor is not None:
            x.mul_(_signed(factor))
    return x


def _row_keys(seeds: list[int], device: torch.device | str) -> torch.Tensor:
    rows = torch.tensor([_signed(seed & _MASK64) for seed in seeds], dtype=torch.int64, device=device)
    return _splitmix64_tensor(rows)


def _gumbel(keys: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """float32 Gumbel noise of token ids `tokens` under row keys `keys` (broadcast together)."""
    bits = _splitmix64_tensor(keys ^ tokens)
    uniform = _shift_right(bits, 40).double().add_(0.5).div_(1 << 24)
    return uniform.log_().neg_().log_().neg_().float()


# Kept under the noise a token needs, which float rounding of scores of any plausible size never crosses.
MARGIN = 1.0
# A token scoring `MARGIN + NEAR` or more under its row's bound wins only with a uniform u over
# 1 - exp(-NEAR): its hash, read unsigned, at least u's 24 bits there (less a step, to spare) << 40.
# torch's int64 is signed, so hashes are compared with the sign bit flipped: `HIGH` is that less 2**63.
NEAR = 5.0
HIGH = ((math.floor((1 << 24) * -math.expm1(-NEAR)) - 1) << 40) - (1 << 63)
CACHED = 1 << 16  # hashes worked out at once on a CPU: a row of a 49k vocabulary stays in L2


def gumbel_noise(seeds: list[int], vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[len(seeds), vocab] float32 standard Gumbel noise, row i a pure function of seeds[i].

    Entry (i, v) is `splitmix64(splitmix64(seeds[i]) ^ v)` in integer ops (the inner hash keeps rows
    of nearby seeds from sharing values), so its 64 bits are the same
    on every device and batch shape; the top 24 bits give a uniform in (0, 1) exactly, and only
    `-log(-log(u))` is left to the device's float math (within an ulp across devices).
    """
    keys = _row_keys(seeds, device)
    return _gumbel(keys[:, None], torch.arange(vocab, dtype=torch.int64, device=device))


def gumbel_argmax(scores: torch.Tensor, seeds: list[int], cached: int = CACHED) -> torch.Tensor:
    """`argmax(scores + gumbel_noise(seeds, V))` per row [B], with the noise's logarithms taken only
    where a token can win.

    The noisy score of each row's best-scoring token, `bound`, bounds the winner's from below. A
    token scoring `MARGIN + NEAR` under it needs noise of that much or more, so a uniform over
    1 - exp(-NEAR) (-log(u) >= 1 - u), which its hash's bits tell without a logarithm (`HIGH`):
    about 0.7% of a row. Only the tokens near the bound and those get the very noise
    `gumbel_noise` gives them, so the token is the same. On a CPU the hashes are worked out whole
    rows at a time, about `cached` tokens' worth (at least one row), where a whole batch's would not
    stay in cache. On the default model's
    scores this halved the sampler's time against giving the full noise to every token its score
    alone let win (35-50% of a row)."""
    rows_n, vocab = scores.shape
    keys = _row_keys(seeds, scores.device)
    top, top_id = scores.max(dim=-1)
    bound = top + _gumbel(keys, top_id)
    may = scores > (bound - MARGIN - NEAR)[:, None]
    ids = torch.arange(vocab, device=scores.device)
    step = rows_n if scores.device.type == "cuda" else max(1, cached // vocab)
    for lo in range(0, rows_n, step):
        bits = _splitmix64_tensor(keys[lo : lo + step, None] ^ ids)
        may[lo : lo + step] |= bits.bitwise_xor_(-(1 << 63)) >= HIGH
    rows, tokens = may.nonzero(as_tuple=True)
    noisy = scores[rows, tokens] + _gumbel(keys[rows], tokens)
    best = torch.full_like(top, float("-inf")).scatter_reduce_(0, rows, noisy, "amax")
    first = noisy == best[rows]  # argmax's tie rule: the first token of a row's best
    winner = torch.full_like(top_id, vocab).scatter_reduce_(0, rows[first], tokens[first], "amin")
    # A row with no best (NaN scores: a diverged model) takes its plain argmax, as the full
    # Gumbel-max would, not an id past the vocabulary.
    return torch.where(winner < vocab, winner, top_id)


def nucleus(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """`logp` with every token outside the top-p nucleus at -inf (as it is when `top_p` is 1)."""
    if top_p >= 1:
        return logp
    sorted_logp, order = torch.sort(logp, dim=-1, descending=True, stable=True)
    probs = sorted_logp.exp()
    outside = (torch.cumsum(probs, dim=-1) - probs) >= top_p
    return logp.masked_fill(torch.zeros_like(outside).scatter_(-1, order, outside), float("-inf"))


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
    tokens = gumbel_argmax(nucleus(logp, params.top_p), seeds)
    return tokens, logp.gather(-1, tokens[:, None])[:, 0]
