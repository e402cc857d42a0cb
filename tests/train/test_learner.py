"""The learner trains on exactly the response tokens, whatever the micro-batching."""

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlhfless.config import AlgorithmConfig, ModelConfig, OptimConfig
from rlhfless.models import tiny_model
from rlhfless.runtime.learner import (
    Group,
    Learner,
    MicroBatch,
    micro_batches,
    prompt_groups,
    response_logprobs,
)
from rlhfless.runtime.samples import Sample

group_st = st.builds(
    lambda p, rs: Group([], p, rs), st.integers(1, 300), st.lists(st.integers(1, 300), min_size=1, max_size=8)
)


@given(st.lists(group_st, min_size=1, max_size=40), st.integers(16, 4096))
def test_micro_batches_cover_every_group_once_within_the_budget(groups, budget):
    batches = micro_batches(groups, budget)
    assert sorted(g for b in batches for g in b) == list(range(len(groups)))
    for b in batches:
        padded = len(b) * max(groups[g].prompt_len for g in b) + sum(
            len(groups[g].response_lens) for g in b
        ) * max(max(groups[g].response_lens) for g in b)
        assert len(b) == 1 or padded <= budget


def make_samples(n=6, vocab=64, seed=0, group=2):
    """Groups of `group` samples share a prompt (as GRPO's G samples do); lengths vary."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        if i % group == 0:
            prompt = torch.randint(
                0, vocab, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g
            ).tolist()
        r = int(torch.randint(1, 12, (1,), generator=g))
        out.append(
            Sample(
                f"u{i // group}",
                i % group,
                prompt,
                torch.randint(0, vocab, (r,), generator=g).tolist(),
                "stop",
            )
        )
    return out


@pytest.fixture
def model():
    return tiny_model(ModelConfig(path="tiny", tiny_hidden_size=32, tiny_layers=1), vocab_size=64, seed=0)


def test_response_logprobs_match_a_full_forward_pass(model):
    samples = make_samples(9, group=3)
    mb = MicroBatch.build(samples, prompt_groups(samples, list(range(9))), pad_id=0)
    samples = [samples[i] for i in mb.rows]
    got = response_logprobs(model, mb, temperature=1.0)
    for b, s in enumerate(samples):
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        logp = torch.log_softmax(model(ids).logits[0].float(), -1)
        p = len(s.prompt_ids)
        want = torch.stack([logp[p - 1 + j, t] for j, t in enumerate(s.response_ids)])
        torch.testing.assert_close(got[b, : len(s.response_ids)], want, atol=1e-5, rtol=1e-5)
        assert torch.all(got[b, len(s.response_ids) :] == 0)


def grads_after_one_update(model, samples, budget, agg):
    model = copy.deepcopy(model)
    learner = Learner(
        model, AlgorithmConfig(loss_agg=agg), OptimConfig(lr=1e-3, grad_clip=0), 1, budget, 1.0, pad_id=0
    )
    adv = [torch.full((len(s.response_ids),), (-1.0) ** i * (i + 1)) for i, s in enumerate(samples)]
    before = [p.detach().clone() for p in model.parameters()]
    metrics = learner.learn(samples, adv, None)
    return [p.detach() - b for p, b in zip(model.parameters(), before, strict=True)], metrics


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_micro_batching_does_not_change_the_update(model, agg):
    samples = make_samples(8)
    whole, m1 = grads_after_one_update(model, samples, budget=10_000, agg=agg)
    split, m2 = grads_after_one_update(model, samples, budget=24, agg=agg)
    assert m1["loss/policy"] == pytest.approx(m2["loss/policy"], rel=1e-5, abs=1e-7)
    for a, b in zip(whole, split, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_on_policy_loss_is_minus_the_mean_token_advantage(model):
    """With old log-probs = current (one epoch), ratio = 1: token-mean loss = -mean(A) over tokens."""
    samples = make_samples(4)
    _, metrics = grads_after_one_update(model, samples, budget=10_000, agg="token-mean")
    adv = [(-1.0) ** i * (i + 1) for i in range(4)]
    tokens = [len(s.response_ids) for s in samples]
    want = -sum(a * t for a, t in zip(adv, tokens, strict=True)) / sum(tokens)
    assert metrics["loss/policy"] == pytest.approx(want, rel=1e-5)
    assert metrics["actor/clip_frac"] == 0.0
