"""The PPO keys of `algorithm.` refuse combinations that would silently do something else, and the
trainer's token rewards put the outcome on the last token and the KL on every token."""

import pytest
import torch

from rlhfless.config import ConfigError, load_config
from rlhfless.runtime.samples import Sample
from rlhfless.runtime.trainer import advantages, token_rewards, whiten_tokens


@pytest.mark.parametrize(
    "overrides, message",
    [
        (("algorithm.kl_in_reward=true", "algorithm.kl_coef=0.1"), "algorithm.kl_in_reward: got True"),
        (("algorithm.name=ppo", "algorithm.kl_in_reward=true", "algorithm.kl_coef=0"), "kl_coef > 0"),
        (("algorithm.name=ppo", "algorithm.kl_ctrl=adaptive", "algorithm.kl_coef=0.1"), "kl_in_reward=true"),
        (("algorithm.lam=1.5",), "algorithm.lam: got 1.5, expected a number in [0, 1]"),
        (("algorithm.value_clip=0",), "algorithm.value_clip: got 0"),
        (("algorithm.kl_estimator=k4",), "algorithm.kl_estimator: got 'k4'"),
    ],
)
def test_bad_ppo_settings_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(preset="tiny", overrides=overrides)


def samples(*specs):
    return [Sample(uid, k, [1], [2] * n, "stop", reward=r) for k, (uid, n, r) in enumerate(specs)]


def test_token_rewards_put_the_outcome_last_and_the_kl_everywhere():
    batch = samples(("a", 3, 1.0), ("a", 1, -2.0))
    kl = [torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.5])]
    got = token_rewards(batch, kl, beta=2.0)
    torch.testing.assert_close(got[0], torch.tensor([-0.2, -0.4, 1.0 - 0.6]))
    torch.testing.assert_close(got[1], torch.tensor([-2.0 - 1.0]))
    torch.testing.assert_close(token_rewards(batch, None, 2.0)[0], torch.tensor([0.0, 0.0, 1.0]))


def test_reinforce_pp_whitens_returns_to_go_over_the_batch_and_rloo_leaves_one_out():
    batch = samples(("a", 2, 1.0), ("a", 1, 0.0), ("b", 1, 2.0))
    cfg = load_config(preset="tiny", overrides=("algorithm.name=reinforce_pp",))
    got = advantages(cfg, batch)
    returns = torch.tensor([1.0, 1.0, 0.0, 2.0])  # gamma = 1: every token sees its outcome
    want = (returns - returns.mean()) / returns.std()
    torch.testing.assert_close(torch.cat(got), want, atol=1e-6, rtol=1e-6)
    rloo = advantages(load_config(preset="tiny", overrides=("algorithm.name=rloo",)), batch)
    torch.testing.assert_close(torch.cat(rloo), torch.tensor([1.0, 1.0, -1.0, 0.0]))


def test_ppo_advantages_are_whitened_over_all_response_tokens():
    got = whiten_tokens([torch.tensor([1.0, 3.0]), torch.tensor([5.0])])
    torch.testing.assert_close(torch.cat(got), torch.tensor([-1.0, 0.0, 1.0]), atol=1e-6, rtol=1e-6)


def test_normalize_reward_whitens_the_step_before_the_kl_is_paid():
    batch = samples(("a", 2, 1.0), ("a", 1, 3.0), ("b", 1, 5.0))
    kl = [torch.tensor([0.5, 0.5]), torch.tensor([0.0]), torch.tensor([1.0])]
    got = token_rewards(batch, kl, beta=1.0, normalize=True)
    # scores 1, 3, 5: mean 3, unbiased std 2 -> -1, 0, 1; the KL is not rescaled
    torch.testing.assert_close(got[0], torch.tensor([-0.5, -1.5]))
    torch.testing.assert_close(got[1], torch.tensor([0.0]))
    torch.testing.assert_close(got[2], torch.tensor([0.0]))


def test_normalize_reward_is_refused_where_rewards_are_not_per_token():
    with pytest.raises(ConfigError, match="algorithm.normalize_reward: got True"):
        load_config(preset="tiny", overrides=("algorithm.normalize_reward=true",))
