"""Masked statistics: whitening and explained variance only see response tokens."""

import statistics

import pytest
import torch

from rlhfless.algo import explained_variance, masked_mean, masked_var, whiten

D = torch.float64


def test_whiten_hand_worked_ignores_padding_and_zeroes_it():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=D)
    # mean 2, unbiased variance ((-1)^2 + 0 + 1^2) / 2 = 1
    torch.testing.assert_close(whiten(x, mask), torch.tensor([[-1.0, 0.0, 1.0, 0.0]], dtype=D))
    unshifted = torch.tensor([[1.0, 2.0, 3.0, 0.0]], dtype=D)
    torch.testing.assert_close(whiten(x, mask, shift_mean=False), unshifted)


@pytest.mark.parametrize("seed", range(3))
def test_masked_stats_match_statistics_module(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 6, generator=g, dtype=D)
    mask = (torch.rand(4, 6, generator=g) < 0.6).to(D)
    mask[0, 0] = mask[0, 1] = 1  # at least two tokens
    picked = [float(v) for v, m in zip(x.flatten(), mask.flatten(), strict=True) if m == 1]
    torch.testing.assert_close(masked_mean(x, mask), torch.tensor(statistics.mean(picked), dtype=D))
    torch.testing.assert_close(masked_var(x, mask), torch.tensor(statistics.variance(picked), dtype=D))
    white = whiten(x, mask, eps=0.0)
    expected = [(v - statistics.mean(picked)) / statistics.stdev(picked) for v in picked]
    torch.testing.assert_close(white[mask == 1], torch.tensor(expected, dtype=D))
    assert torch.all(white[mask == 0] == 0)


def test_single_token_and_empty_masks_whiten_to_zero():
    x = torch.tensor([[5.0, 3.0]], dtype=D)
    torch.testing.assert_close(whiten(x, torch.tensor([[1.0, 0.0]], dtype=D)), torch.zeros(1, 2, dtype=D))
    torch.testing.assert_close(whiten(x, torch.zeros(1, 2, dtype=D)), torch.zeros(1, 2, dtype=D))


def test_explained_variance_perfect_constant_and_hand_worked():
    returns = torch.tensor([[1.0, 2.0, 3.0, 50.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=D)
    assert float(explained_variance(returns, returns, mask)) == pytest.approx(1.0)
    assert float(explained_variance(torch.full_like(returns, 2.0), returns, mask)) == pytest.approx(0.0)
    # residuals 1, 0, 1: variance 1/3 against variance 1 of the returns
    values = torch.tensor([[0.0, 2.0, 2.0, 0.0]], dtype=D)
    assert float(explained_variance(values, returns, mask)) == pytest.approx(1 - 1 / 3)
