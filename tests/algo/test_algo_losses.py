"""Loss aggregation, the PPO clipped policy loss and the clipped value loss."""

import math

import pytest
import torch

from rlhfless.algo import aggregate_loss, policy_loss, value_loss

D = torch.float64
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def random_case(seed: int, batch: int = 4, seq: int = 6):
    g = torch.Generator().manual_seed(seed)
    loss = torch.randn(batch, seq, generator=g, dtype=D)
    mask = (torch.rand(batch, seq, generator=g) < 0.6).to(D)
    mask[:, 0] = 1  # every row has a response token
    return g, loss, mask


# ---- aggregate_loss ----


def test_aggregate_loss_hand_worked_with_padding_values_excluded():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=D)
    assert float(aggregate_loss(loss, mask, "token-mean")) == pytest.approx(10 / 4)
    assert float(aggregate_loss(loss, mask, "seq-mean-token-mean")) == pytest.approx((2 + 4) / 2)
    assert float(aggregate_loss(loss, mask, "seq-mean-token-sum")) == pytest.approx((6 + 4) / 2)
    # divided by the mask's width (3), not by any row's length
    assert float(aggregate_loss(loss, mask, "seq-mean-token-sum-norm")) == pytest.approx((6 + 4) / 2 / 3)


def test_token_sum_norm_without_a_length_divides_by_width_so_padding_columns_scale_it():
    loss = torch.tensor([[1.0, 2.0]], dtype=D)
    mask = torch.ones(1, 2, dtype=D)
    wider_loss = torch.tensor([[1.0, 2.0, 0.0, 0.0]], dtype=D)
    wider_mask = torch.tensor([[1.0, 1.0, 0.0, 0.0]], dtype=D)
    assert float(aggregate_loss(loss, mask, "seq-mean-token-sum-norm")) == pytest.approx(1.5)
    assert float(aggregate_loss(wider_loss, wider_mask, "seq-mean-token-sum-norm")) == pytest.approx(0.75)


def test_token_sum_norm_with_a_fixed_length_ignores_the_padding():
    """The learner passes the longest response, so however a micro-batch is padded the scale holds."""
    loss = torch.tensor([[1.0, 2.0]], dtype=D)
    wider_loss = torch.tensor([[1.0, 2.0, 0.0, 0.0]], dtype=D)
    wider_mask = torch.tensor([[1.0, 1.0, 0.0, 0.0]], dtype=D)
    narrow = aggregate_loss(loss, torch.ones(1, 2, dtype=D), "seq-mean-token-sum-norm", norm_len=8)
    wide = aggregate_loss(wider_loss, wider_mask, "seq-mean-token-sum-norm", norm_len=8)
    assert float(narrow) == float(wide) == pytest.approx(3 / 8)


def test_seq_mean_token_mean_skips_rows_without_response_tokens():
    loss = torch.tensor([[2.0, 4.0], [9.0, 9.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=D)
    assert float(aggregate_loss(loss, mask, "seq-mean-token-mean")) == pytest.approx(3.0)
    assert float(aggregate_loss(loss, mask, "token-mean")) == pytest.approx(3.0)


def reference_aggregate(loss: list[list[float]], mask: list[list[float]], mode: str) -> float:
    sums = [sum(v * m for v, m in zip(row, mrow, strict=True)) for row, mrow in zip(loss, mask, strict=True)]
    counts = [sum(mrow) for mrow in mask]
    if mode == "token-mean":
        return sum(sums) / sum(counts)
    if mode == "seq-mean-token-mean":
        return sum(s / c for s, c in zip(sums, counts, strict=True)) / len(sums)
    if mode == "seq-mean-token-sum":
        return sum(sums) / len(sums)
    return sum(sums) / len(sums) / len(mask[0])


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("mode", MODES)
def test_aggregate_loss_matches_loops(seed, mode):
    _, loss, mask = random_case(seed)
    expected = reference_aggregate(loss.tolist(), mask.tolist(), mode)
    assert float(aggregate_loss(loss, mask, mode)) == pytest.approx(expected)


def test_aggregate_loss_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="shapes"):
        aggregate_loss(torch.zeros(2, 3), torch.ones(2, 4), "token-mean")


# ---- policy_loss ----


def test_policy_loss_hand_worked_clipping_and_dual_clip():
    # ratios 1.5, 1.5, 0.5, 0.5 against advantages +1, -1, +1, -1; clip 0.2 -> bounds 0.8, 1.2
    ratio = torch.tensor([[1.5, 1.5, 0.5, 0.5]], dtype=D)
    old = torch.zeros(1, 4, dtype=D)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]], dtype=D)
    mask = torch.ones(1, 4, dtype=D)
    # per token: max(-A r, -A clip(r)) = max(-1.5, -1.2), max(1.5, 1.2), max(-0.5, -0.8), max(0.5, 0.8)
    loss, metrics = policy_loss(ratio.log(), old, adv, mask)
    assert float(loss) == pytest.approx((-1.2 + 1.5 - 0.5 + 0.8) / 4)
    assert float(metrics["clip_frac"]) == pytest.approx(2 / 4)  # tokens 0 and 3
    assert float(metrics["clip_frac_lower"]) == 0.0
    assert float(metrics["approx_kl"]) == pytest.approx(-(2 * math.log(1.5) + 2 * math.log(0.5)) / 4)
    # dual clip 1.3 bounds the negative-advantage token 1 at 1.3 * |A|; token 3 (0.8) stays
    loss, metrics = policy_loss(ratio.log(), old, adv, mask, dual_clip=1.3)
    assert float(loss) == pytest.approx((-1.2 + 1.3 - 0.5 + 0.8) / 4)
    assert float(metrics["clip_frac_lower"]) == pytest.approx(1 / 4)


def test_policy_loss_asymmetric_clip_range():
    logp = torch.tensor([[math.log(1.25)]], dtype=D)
    ones = torch.ones(1, 1, dtype=D)
    loss, _ = policy_loss(logp, torch.zeros_like(ones), ones, ones, clip_low=0.2, clip_high=0.28)
    assert float(loss) == pytest.approx(-1.25)  # inside [0.8, 1.28]: not clipped


def reference_policy_token(lp, olp, a, lo, hi, c):
    """Loss and d loss / d logp for one token."""
    r = math.exp(lp - olp)
    unclipped, clipped = -a * r, -a * min(max(r, 1 - lo), 1 + hi)
    loss, grad = (unclipped, -a * r) if unclipped >= clipped else (clipped, 0.0)
    if c is not None and a < 0 and loss > -c * a:
        loss, grad = -c * a, 0.0
    return loss, grad, clipped > unclipped


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dual_clip", [None, 1.5])
def test_policy_loss_value_metrics_and_gradient_match_loops(seed, dual_clip):
    g, adv, mask = random_case(seed)
    old = -torch.rand(adv.shape, generator=g, dtype=D) * 3
    logp = (old + torch.randn(adv.shape, generator=g, dtype=D) * 0.6).requires_grad_()
    loss, metrics = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.3, dual_clip=dual_clip)
    loss.backward()
    n = float(mask.sum())
    total, clipped_count, kl = 0.0, 0, 0.0
    expected_grad = torch.zeros_like(adv)
    for b in range(adv.shape[0]):
        for t in range(adv.shape[1]):
            if mask[b, t] == 0:
                continue
            lp, olp, a = float(logp.detach()[b, t]), float(old[b, t]), float(adv[b, t])
            token_loss, token_grad, was_clipped = reference_policy_token(lp, olp, a, 0.2, 0.3, dual_clip)
            total += token_loss
            clipped_count += was_clipped
            kl += olp - lp
            expected_grad[b, t] = token_grad / n
    assert loss.item() == pytest.approx(total / n)
    assert float(metrics["clip_frac"]) == pytest.approx(clipped_count / n)
    assert float(metrics["approx_kl"]) == pytest.approx(kl / n)
    torch.testing.assert_close(logp.grad, expected_grad)
    assert all(not m.requires_grad for m in metrics.values())


def test_dual_clip_must_exceed_one():
    with pytest.raises(ValueError, match="^dual_clip: got 1.0"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), dual_clip=1.0)


# ---- value_loss ----


def test_value_loss_hand_worked():
    values = torch.tensor([[1.5, 0.9, 1.5]], dtype=D)
    old = torch.tensor([[1.0, 1.0, 1.0]], dtype=D)
    returns = torch.tensor([[1.0, 2.0, 2.0]], dtype=D)
    mask = torch.ones(1, 3, dtype=D)
    # token 0: max(0.5^2, (1.2 - 1)^2) = 0.25; token 1: v inside the clip, 1.1^2 = 1.21;
    # token 2: max(0.5^2, (1.2 - 2)^2) = 0.64, the clipped branch
    expected = 0.5 * (0.25 + 1.21 + 0.64) / 3
    assert float(value_loss(values, old, returns, mask)) == pytest.approx(expected)
    unclipped = 0.5 * (0.25 + 1.21 + 0.25) / 3
    assert float(value_loss(values, old, returns, mask, clip=None)) == pytest.approx(unclipped)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("mode", MODES)
def test_value_loss_matches_loop(seed, mode):
    g, values, mask = random_case(seed)
    old = values + torch.randn(values.shape, generator=g, dtype=D) * 0.3
    returns = torch.randn(values.shape, generator=g, dtype=D)
    per_token = [
        [
            0.5 * max((v - r) ** 2, (o + min(max(v - o, -0.2), 0.2) - r) ** 2)
            for v, o, r in zip(vrow, orow, rrow, strict=True)
        ]
        for vrow, orow, rrow in zip(values.tolist(), old.tolist(), returns.tolist(), strict=True)
    ]
    expected = reference_aggregate(per_token, mask.tolist(), mode)
    assert float(value_loss(values, old, returns, mask, clip=0.2, agg=mode)) == pytest.approx(expected)
