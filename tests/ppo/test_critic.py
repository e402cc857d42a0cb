"""The critic: values read from the shared prompt-once forward, GAE from its pre-update values,
and an update that fits the returns whatever the micro-batching."""

import copy

import pytest
import torch

from rlhfless.algo import gae
from rlhfless.algo.config import AlgorithmConfig
from rlhfless.config import ModelConfig, OptimConfig
from rlhfless.models import tiny_model
from rlhfless.runtime import critic as critic_module
from rlhfless.runtime.critic import Critic, ValueModel, response_values
from rlhfless.runtime.micro_batch import MicroBatch, prompt_groups
from rlhfless.runtime.samples import Sample


def make_samples(n=6, vocab=64, seed=0, group=2):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        if i % group == 0:
            prompt = torch.randint(0, vocab, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g)
        r = int(torch.randint(1, 12, (1,), generator=g))
        response = torch.randint(0, vocab, (r,), generator=g).tolist()
        out.append(Sample(f"u{i // group}", i % group, prompt.tolist(), response, "stop"))
    return out


def token_rewards(samples):
    """Outcome reward on the last token: +1 for even samples, -1 for odd ones."""
    out = []
    for i, s in enumerate(samples):
        r = torch.zeros(len(s.response_ids))
        r[-1] = 1.0 if i % 2 == 0 else -1.0
        out.append(r)
    return out


@pytest.fixture
def value_model():
    policy = tiny_model(ModelConfig(path="tiny", tiny_hidden_size=32, tiny_layers=1), vocab_size=64, seed=0)
    model = ValueModel.from_policy(policy)
    torch.nn.init.normal_(model.value_head.weight, std=0.5, generator=torch.Generator().manual_seed(1))
    return model


def critic(model, budget=10_000, **algo):
    algo_cfg, optim = AlgorithmConfig(name="ppo", **algo), OptimConfig(grad_clip=0)
    return Critic(model, algo_cfg, optim, budget, pad_id=0, seed=0, norm_len=16)


def full_forward_values(model, s):
    ids = torch.tensor([s.prompt_ids + s.response_ids])
    hidden = model.backbone(input_ids=ids).last_hidden_state[0]
    values = model.value_head(hidden).squeeze(-1)
    p = len(s.prompt_ids)
    return values[p - 1 : p - 1 + len(s.response_ids)]


def test_a_new_critic_starts_from_the_policy_backbone_with_a_zero_head():
    policy = tiny_model(ModelConfig(path="tiny", tiny_hidden_size=32, tiny_layers=1), vocab_size=64, seed=0)
    model = ValueModel.from_policy(policy)
    for a, b in zip(model.backbone.parameters(), policy.base_model.parameters(), strict=True):
        assert a is not b and torch.equal(a, b)
    assert torch.all(model.value_head.weight == 0) and torch.all(model.value_head.bias == 0)


def test_response_values_match_a_full_forward_pass(value_model):
    samples = make_samples(9, group=3)
    mb = MicroBatch.build(samples, prompt_groups(samples, list(range(9))), pad_id=0)
    got = response_values(value_model, mb)
    for b, i in enumerate(mb.rows):
        s = samples[i]
        torch.testing.assert_close(got[b, : len(s.response_ids)], full_forward_values(value_model, s))
        assert torch.all(got[b, len(s.response_ids) :] == 0)


def test_advantages_are_gae_of_the_values_before_the_update(value_model):
    samples = make_samples(6)
    rewards = token_rewards(samples)
    before = copy.deepcopy(value_model)
    adv, metrics = critic(value_model, gamma=0.9, lam=0.8).update(samples, rewards)
    losses = []
    for s, a, r in zip(samples, adv, rewards, strict=True):
        v = full_forward_values(before, s).detach().unsqueeze(0)
        want, ret = gae(r.unsqueeze(0), v, torch.ones_like(v), gamma=0.9, lam=0.8)
        torch.testing.assert_close(a, want[0])
        losses.append(0.5 * (v - ret).square())
    # one update, no clipping yet (v == v_old): the token-mean of 0.5 (v - R)^2
    assert metrics["loss/value"] == pytest.approx(float(torch.cat(losses, dim=1).mean()), rel=1e-5)
    changed = any(
        not torch.equal(p, q) for p, q in zip(value_model.parameters(), before.parameters(), strict=True)
    )
    assert changed


@pytest.mark.parametrize("epochs, mini_batches", [(1, 1), (2, 2)])
def test_micro_batching_does_not_change_the_critic_update(value_model, epochs, mini_batches):
    samples = make_samples(8)
    runs = []
    for budget in (10_000, 24):
        model = copy.deepcopy(value_model)
        adv, metrics = critic(model, budget, epochs=epochs, mini_batches=mini_batches).update(
            samples, token_rewards(samples)
        )
        runs.append((adv, metrics, list(model.parameters())))
    (adv1, m1, p1), (adv2, m2, p2) = runs
    assert m1["loss/value"] == pytest.approx(m2["loss/value"], rel=1e-5)
    for a, b in zip(adv1, adv2, strict=True):
        torch.testing.assert_close(a, b)
    for a, b in zip(p1, p2, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_repeated_updates_fit_the_returns(value_model):
    samples = make_samples(6)
    rewards = token_rewards(samples)
    c = critic(value_model, critic_lr=1e-2, lam=1.0, epochs=2, mini_batches=2)
    history = [c.update(samples, rewards)[1] for _ in range(15)]
    assert history[-1]["loss/value"] < 0.2 * history[0]["loss/value"]
    assert history[-1]["value/explained_variance"] > history[0]["value/explained_variance"]
    assert history[-1]["value/explained_variance"] > 0.5


def test_critic_state_round_trips(value_model):
    samples = make_samples(4)
    a = critic(value_model, critic_lr=1e-2)
    a.update(samples, token_rewards(samples))
    b = critic(copy.deepcopy(value_model), critic_lr=1e-2)
    torch.nn.init.zeros_(b.model.value_head.weight)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    _, ma = a.update(samples, token_rewards(samples))
    _, mb = b.update(samples, token_rewards(samples))
    assert ma == pytest.approx(mb, rel=1e-6)


def test_the_critic_shuffle_changes_every_update_and_is_checkpointed(value_model, monkeypatch):
    seeds = []
    order = critic_module.update_order
    monkeypatch.setattr(critic_module, "update_order", lambda *a: seeds.append(a[-1]) or order(*a))
    samples = make_samples(4)
    a = critic(value_model, mini_batches=2)
    for _ in range(2):
        a.update(samples, token_rewards(samples))
    b = critic(copy.deepcopy(value_model), mini_batches=2)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    a.update(samples, token_rewards(samples))
    b.update(samples, token_rewards(samples))
    assert len(set(seeds[:3])) == 3 and seeds[2] == seeds[3]
