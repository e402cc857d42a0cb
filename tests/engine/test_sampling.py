"""The counter-based sampler: randomness is a pure function of the sequence's keys."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.engine import sampling
from rlhfless.engine.sampling import (
    SamplingParams,
    _splitmix64,
    gumbel_argmax,
    gumbel_noise,
    nucleus,
    sample_tokens,
    sequence_key,
    token_seed,
)


def test_noise_is_a_pure_function_of_key_and_position():
    keys = [sequence_key(0, 1, "a", 0), sequence_key(0, 1, "a", 1), sequence_key(0, 1, "b", 0)]
    assert len(set(keys)) == 3
    assert sequence_key(0, 1, "a", 0) not in (sequence_key(1, 1, "a", 0), sequence_key(0, 2, "a", 0))
    seeds = [token_seed(k, 5) for k in keys]
    noise = gumbel_noise(seeds, 64)
    assert torch.equal(gumbel_noise(seeds[::-1], 64), noise.flip(0))  # order and batch do not matter
    assert torch.equal(gumbel_noise(seeds[1:2], 64)[0], noise[1])
    assert not torch.equal(gumbel_noise([token_seed(keys[0], 6)], 64)[0], noise[0])
    # standard Gumbel: mean = Euler-Mascheroni constant, variance = pi^2 / 6
    many = gumbel_noise([token_seed(keys[0], p) for p in range(200)], 100)
    assert abs(many.mean().item() - 0.5772) < 0.02
    assert abs(many.var().item() - np.pi**2 / 6) < 0.08


def draw(logits: torch.Tensor, params: SamplingParams, n: int) -> np.ndarray:
    seeds = [token_seed(sequence_key(params.seed, 0, f"u{i}", 0), 0) for i in range(n)]
    tokens, _ = sample_tokens(logits.expand(n, -1), params, seeds)
    return np.bincount(tokens.numpy(), minlength=logits.shape[-1]) / n


def test_sampling_follows_the_tempered_and_nucleus_filtered_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()[None]
    np.testing.assert_allclose(draw(logits, SamplingParams(1), 6000), probs.numpy(), atol=0.02)
    tempered = torch.softmax(logits[0] / 0.5, dim=-1).numpy()
    np.testing.assert_allclose(draw(logits, SamplingParams(1, temperature=0.5), 6000), tempered, atol=0.02)
    # top_p=0.7 keeps the two most likely tokens (0.5 + 0.3 >= 0.7), renormalised
    np.testing.assert_allclose(
        draw(logits, SamplingParams(1, top_p=0.7), 6000), [0.625, 0.375, 0, 0], atol=0.02
    )


def test_greedy_takes_the_argmax_and_reports_its_logprob():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    tokens, logprobs = sample_tokens(logits, SamplingParams(1, temperature=0), [0, 0])
    assert tokens.tolist() == [1, 0]
    torch.testing.assert_close(logprobs, torch.log_softmax(logits, -1).max(-1).values)


@pytest.mark.parametrize("field,value", [("max_new_tokens", 0), ("temperature", -1.0), ("top_p", 0.0)])
def test_invalid_params_are_rejected(field, value):
    kwargs = {"max_new_tokens": 4, field: value}
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("threads", [1, 2])
def test_noise_bits_are_the_integer_hash_whatever_the_batch_shape_and_threads(threads):
    """Integer ops give the same bits on any device; here: the pure-Python hash, any batch, any
    thread count."""
    keys = [token_seed(sequence_key(3, 1, f"u{i}", i % 4), i) for i in range(37)]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        batch = gumbel_noise(keys, 5000)
        rows = torch.cat([gumbel_noise(keys[i : i + 5], 5000) for i in range(0, len(keys), 5)])
    finally:
        torch.set_num_threads(before)
    assert torch.equal(batch, rows)
    for i, v in ((0, 0), (17, 4321), (36, 4999)):
        bits = _splitmix64(_splitmix64(keys[i]) ^ v)
        u = ((bits >> 40) + 0.5) / (1 << 24)
        assert float(batch[i, v]) == pytest.approx(-math.log(-math.log(u)), rel=1e-6)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_noise_and_tokens_are_the_same_on_cuda():
    """The same integer bits on the GPU: the noise within float rounding, the tokens equal."""
    seeds = [token_seed(sequence_key(0, 1, f"u{i}", i % 3), i) for i in range(64)]
    cpu = gumbel_noise(seeds, 50000)
    cuda = gumbel_noise(seeds, 50000, "cuda").cpu()
    assert torch.allclose(cpu, cuda, rtol=1e-6, atol=1e-6)
    logits = torch.randn(64, 50000, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(max_new_tokens=1, temperature=0.8, top_p=0.9, seed=0)
    assert torch.equal(
        sample_tokens(logits, params, seeds)[0], sample_tokens(logits.cuda(), params, seeds)[0].cpu()
    )


@settings(max_examples=120, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(2, 3000),
    st.floats(0.05, 30.0),
    st.floats(0.05, 1.0),
    st.integers(0, 2**32),
    st.integers(1, 4),
)
def test_the_noise_worked_out_only_where_it_can_win_picks_the_full_gumbel_max_token(
    rows, vocab, spread, top_p, seed, rows_at_once
):
    """Peaked and flat rows, nucleus-filtered or not, hashed a row or a few at a time: the token is
    the argmax of every token's full noisy score."""
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * spread
    scores = nucleus(torch.log_softmax(logits, dim=-1), top_p)
    seeds = [token_seed(seed, r) for r in range(rows)]
    want = (scores + gumbel_noise(seeds, vocab)).argmax(dim=-1)
    assert torch.equal(gumbel_argmax(scores, seeds, cached=rows_at_once * vocab), want)


def test_a_winner_far_under_the_best_score_is_found_by_its_noise():
    """One token 8 nats over 2,999 others: in about half the rows one of the others wins, though
    it scores more than `MARGIN + NEAR` under the bound, so only its hash's bits let it in."""
    scores = torch.full((200, 3000), -8.0)
    scores[:, 0] = 0.0
    seeds = [token_seed(5, r) for r in range(200)]
    want = (scores + gumbel_noise(seeds, 3000)).argmax(dim=-1)
    assert 40 < int((want != 0).sum()) < 160
    assert torch.equal(gumbel_argmax(scores, seeds), want)


def test_a_row_of_nan_scores_still_samples_a_token_of_the_vocabulary():
    """A diverged model's row has no best noisy score; the other rows are sampled as ever."""
    scores = torch.randn(3, 500, generator=torch.Generator().manual_seed(1))
    scores[1] = float("nan")
    seeds = [token_seed(2, r) for r in range(3)]
    tokens = gumbel_argmax(scores, seeds)
    assert 0 <= int(tokens[1]) < 500
    full = (scores + gumbel_noise(seeds, 500)).argmax(dim=-1)
    assert tokens[[0, 2]].tolist() == full[[0, 2]].tolist()


def test_a_token_far_under_the_bound_is_hashed_in_only_when_its_uniform_is_that_high():
    """`HIGH` read back: the least 64-bit hash (unsigned) let in has its 24-bit uniform over
    1 - exp(-NEAR), one step spared; one step less is left out."""
    least = sampling.HIGH + (1 << 63)
    u = ((least >> 40) + 0.5) / (1 << 24)
    assert u < -math.expm1(-sampling.NEAR) <= u + 2 / (1 << 24)
    flipped = torch.tensor([least - (1 << 40), least], dtype=torch.uint64).view(torch.int64) ^ -(1 << 63)
    assert (flipped >= sampling.HIGH).tolist() == [False, True]
