"""Advantage estimators against hand-worked values and against per-sample Python loops."""

import math
import statistics

import pytest
import torch

from rlhfless.algo import gae, grpo_advantages, reinforce_pp_advantages, rloo_advantages

D = torch.float64


def random_batch(seed: int, batch: int = 5, seq: int = 7) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rewards, values and a mask with left and right padding (a response span per row)."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(batch, seq, generator=g, dtype=D)
    values = torch.randn(batch, seq, generator=g, dtype=D)
    mask = torch.zeros(batch, seq, dtype=D)
    for b in range(batch):
        start = int(torch.randint(0, seq, (1,), generator=g))
        length = int(torch.randint(1, seq - start + 1, (1,), generator=g))
        mask[b, start : start + length] = 1
    return rewards, values, mask


# ---- GRPO / RLOO: one reward per sample, grouped ----


def test_grpo_hand_worked_groups_including_a_group_of_one():
    # group 7: rewards 1, 0, 0, 0 -> mean 0.25, unbiased std sqrt(0.75/3) = 0.5
    # group 9: rewards 2, 4 -> mean 3, unbiased std sqrt(2); group 3: a single sample -> 0
    rewards = torch.tensor([1.0, 0.0, 5.0, 0.0, 0.0, 2.0, 4.0], dtype=D)
    ids = [7, 7, 3, 7, 7, 9, 9]
    expected = torch.tensor([1.5, -0.5, 0.0, -0.5, -0.5, -1 / math.sqrt(2), 1 / math.sqrt(2)], dtype=D)
    torch.testing.assert_close(grpo_advantages(rewards, ids), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(grpo_advantages(rewards, torch.tensor(ids)), expected, atol=1e-5, rtol=0)


def test_grpo_without_std_is_reward_minus_group_mean():
    rewards = torch.tensor([1.0, 0.0, 5.0, 0.0, 0.0, 2.0, 4.0], dtype=D)
    ids = ["a", "a", "b", "a", "a", "c", "c"]
    expected = torch.tensor([0.75, -0.25, 0.0, -0.25, -0.25, -1.0, 1.0], dtype=D)
    torch.testing.assert_close(grpo_advantages(rewards, ids, norm_by_std=False), expected)


def test_grpo_identical_rewards_in_a_group_give_zero_not_nan():
    advantages = grpo_advantages(torch.tensor([1.0, 1.0, 1.0]), [0, 0, 0])
    torch.testing.assert_close(advantages, torch.zeros(3))


def test_grpo_accepts_integer_rewards():
    advantages = grpo_advantages(torch.tensor([1, 0]), torch.tensor([4, 4]))
    assert advantages.is_floating_point()
    assert advantages[0] > 0 > advantages[1]


def reference_grpo(rewards: list[float], ids: list[int], eps: float) -> list[float]:
    out = []
    for r, gid in zip(rewards, ids, strict=True):
        group = [x for x, h in zip(rewards, ids, strict=True) if h == gid]
        if len(group) == 1:
            out.append(0.0)
        else:
            out.append((r - statistics.mean(group)) / (statistics.stdev(group) + eps))
    return out


def reference_rloo(rewards: list[float], ids: list[int]) -> list[float]:
    out = []
    for i, (r, gid) in enumerate(zip(rewards, ids, strict=True)):
        others = [x for j, (x, h) in enumerate(zip(rewards, ids, strict=True)) if h == gid and j != i]
        out.append(r - statistics.mean(others) if others else 0.0)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_grpo_and_rloo_match_loops_on_random_groups(seed):
    g = torch.Generator().manual_seed(seed)
    n = 17
    rewards = torch.randn(n, generator=g, dtype=D)
    ids = torch.randint(0, 6, (n,), generator=g)  # some groups of one, some absent
    expected_grpo = reference_grpo(rewards.tolist(), ids.tolist(), eps=1e-6)
    expected_rloo = reference_rloo(rewards.tolist(), ids.tolist())
    torch.testing.assert_close(grpo_advantages(rewards, ids), torch.tensor(expected_grpo, dtype=D))
    torch.testing.assert_close(rloo_advantages(rewards, ids), torch.tensor(expected_rloo, dtype=D))


def test_rloo_hand_worked_groups_including_a_group_of_one():
    rewards = torch.tensor([1.0, 0.0, 5.0, 0.0, 0.0, 2.0, 4.0], dtype=D)
    ids = [7, 7, 3, 7, 7, 9, 9]
    expected = torch.tensor([1.0, -1 / 3, 0.0, -1 / 3, -1 / 3, -2.0, 2.0], dtype=D)
    torch.testing.assert_close(rloo_advantages(rewards, ids), expected)


def test_outcome_estimators_reject_mismatched_shapes():
    with pytest.raises(ValueError, match="group_ids"):
        grpo_advantages(torch.zeros(3), [0, 0])
    with pytest.raises(ValueError, match="rewards"):
        rloo_advantages(torch.zeros(2, 3), [0, 0])


# ---- GAE ----


def test_gae_hand_worked_full_row():
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=D)
    values = torch.tensor([[0.5, 0.6, 0.7]], dtype=D)
    mask = torch.ones(1, 3, dtype=D)
    # gamma = lam = 1: A_t = (sum of remaining rewards) - V_t, returns = 1 everywhere
    advantages, returns = gae(rewards, values, mask)
    torch.testing.assert_close(advantages, torch.tensor([[0.5, 0.4, 0.3]], dtype=D))
    torch.testing.assert_close(returns, torch.ones(1, 3, dtype=D))
    # gamma 0.9, lam 0.5: delta = (0.04, 0.03, 0.3); A2 = 0.3, A1 = 0.03 + 0.45 * 0.3, A0 = 0.04 + 0.45 * A1
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    torch.testing.assert_close(advantages, torch.tensor([[0.11425, 0.165, 0.3]], dtype=D))
    torch.testing.assert_close(returns, advantages + values)


def test_gae_ignores_padding_and_takes_value_after_last_token_as_zero():
    rewards = torch.tensor([[0.0, 1.0, 7.0]], dtype=D)  # reward on padding must not count
    values = torch.tensor([[0.2, 0.3, 9.0]], dtype=D)  # nor the value on padding
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=D)
    advantages, returns = gae(rewards, values, mask)
    torch.testing.assert_close(advantages, torch.tensor([[0.8, 0.7, 0.0]], dtype=D))
    torch.testing.assert_close(returns[:, :2], torch.tensor([[1.0, 1.0]], dtype=D))


def reference_gae(rewards, values, mask, gamma, lam):
    batch, seq = len(rewards), len(rewards[0])
    advantages = [[0.0] * seq for _ in range(batch)]
    for b in range(batch):
        positions = [t for t in range(seq) if mask[b][t] == 1]
        next_value = next_adv = 0.0
        for t in reversed(positions):
            delta = rewards[b][t] + gamma * next_value - values[b][t]
            next_adv = delta + gamma * lam * next_adv
            next_value = values[b][t]
            advantages[b][t] = next_adv
    return advantages


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.5, 0.0)])
def test_gae_matches_loop_on_random_padded_batches(seed, gamma, lam):
    rewards, values, mask = random_batch(seed)
    expected = reference_gae(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
    advantages, returns = gae(rewards, values, mask, gamma=gamma, lam=lam)
    torch.testing.assert_close(advantages, torch.tensor(expected, dtype=D))
    torch.testing.assert_close(returns, advantages + values)


def test_gae_with_lam_zero_is_the_one_step_td_error():
    rewards, values, mask = random_batch(11)
    full = mask.clone()
    full[:] = 1
    advantages, _ = gae(rewards, values, full, gamma=0.9, lam=0.0)
    next_values = torch.cat([values[:, 1:], torch.zeros(values.shape[0], 1, dtype=D)], dim=1)
    torch.testing.assert_close(advantages, rewards + 0.9 * next_values - values)


# ---- REINFORCE++ ----


def test_reinforce_pp_hand_worked():
    token_rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 5.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=D)
    advantages, returns = reinforce_pp_advantages(token_rewards, mask)
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]], dtype=D))
    # returns on the mask: 1, 1, 1, 2, 2 -> mean 1.4, unbiased variance (3 * 0.16 + 2 * 0.36) / 4 = 0.3
    s = math.sqrt(0.3)
    expected = torch.tensor([[-0.4 / s, -0.4 / s, -0.4 / s], [0.6 / s, 0.6 / s, 0.0]], dtype=D)
    torch.testing.assert_close(advantages, expected, atol=1e-6, rtol=0)
    _, discounted = reinforce_pp_advantages(token_rewards, mask, gamma=0.5)
    torch.testing.assert_close(discounted[0], torch.tensor([0.25, 0.5, 1.0], dtype=D))


@pytest.mark.parametrize("seed", range(4))
def test_reinforce_pp_matches_loop_on_random_padded_batches(seed):
    token_rewards, _, mask = random_batch(seed)
    gamma = 0.9
    rows, cols = token_rewards.shape
    expected_returns = [[0.0] * cols for _ in range(rows)]
    for b in range(rows):
        running = 0.0
        for t in reversed([t for t in range(cols) if mask[b, t] == 1]):
            running = float(token_rewards[b, t]) + gamma * running
            expected_returns[b][t] = running
    on_mask = [expected_returns[b][t] for b in range(rows) for t in range(cols) if mask[b, t] == 1]
    mean, std = statistics.mean(on_mask), statistics.stdev(on_mask)
    expected_adv = [
        [(expected_returns[b][t] - mean) / std if mask[b, t] == 1 else 0.0 for t in range(cols)]
        for b in range(rows)
    ]
    advantages, returns = reinforce_pp_advantages(token_rewards, mask, gamma=gamma)
    torch.testing.assert_close(returns, torch.tensor(expected_returns, dtype=D))
    torch.testing.assert_close(advantages, torch.tensor(expected_adv, dtype=D), atol=1e-6, rtol=1e-6)


def test_token_estimators_reject_mismatched_shapes():
    with pytest.raises(ValueError, match="shapes"):
        gae(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match="shapes"):
        reinforce_pp_advantages(torch.zeros(3), torch.ones(3))
