"""The learner trains on exactly the response tokens, whatever the micro-batching."""

import copy
import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlhfless.algo import LOSS_AGGREGATIONS
from rlhfless.algo.config import AlgorithmConfig
from rlhfless.config import ModelConfig, OptimConfig
from rlhfless.models import load_model, tiny_model
from rlhfless.runtime import learner as learner_module
from rlhfless.runtime import logprobs as logprobs_module
from rlhfless.runtime.learner import Learner, shuffle_seed
from rlhfless.runtime.logprobs import response_hidden, response_logprobs
from rlhfless.runtime.micro_batch import Group, MicroBatch, micro_batches, prompt_groups
from rlhfless.runtime.samples import Sample

group_st = st.builds(
    lambda p, rs: Group([], p, rs), st.integers(1, 300), st.lists(st.integers(1, 300), min_size=1, max_size=8)
)


@given(st.lists(group_st, min_size=1, max_size=40), st.integers(16, 4096))
def test_micro_batches_cover_every_group_once_within_the_budget(groups, budget):
    batches = micro_batches(groups, budget)
    assert sorted(g for b in batches for g in b) == list(range(len(groups)))
    for b in batches:
        longest_prompt = max(groups[g].prompt_len for g in b)
        longest_row = max(sum(groups[g].response_lens) for g in b)
        assert len(b) == 1 or len(b) * (longest_prompt + longest_row) <= budget


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


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_response_logprobs_match_a_full_forward_pass(model, attention):
    """Each group's responses run packed in one row: a token sees its prompt and its own sample."""
    model.set_attn_implementation(attention)
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


def grads_after_one_update(model, samples, budget, agg, copy_model=True):
    model = copy.deepcopy(model) if copy_model else model
    algo, optim = AlgorithmConfig(loss_agg=agg), OptimConfig(lr=1e-3, grad_clip=0)
    learner = Learner(model, algo, optim, 1, budget, 1.0, pad_id=0, seed=0, norm_len=16)
    adv = [torch.full((len(s.response_ids),), (-1.0) ** i * (i + 1)) for i, s in enumerate(samples)]
    before = [p.detach().clone() for p in model.parameters()]
    metrics = learner.learn(samples, adv, None)
    return [p.detach() - b for p, b in zip(model.parameters(), before, strict=True)], metrics


@pytest.mark.parametrize("agg", list(LOSS_AGGREGATIONS))
def test_micro_batching_does_not_change_the_update(model, agg):
    """Also for `seq-mean-token-sum-norm`: its constant is the run's longest response, not a
    micro-batch's width."""
    samples = make_samples(8)
    whole, m1 = grads_after_one_update(model, samples, budget=10_000, agg=agg)
    split, m2 = grads_after_one_update(model, samples, budget=24, agg=agg)
    assert m1["loss/policy"] == pytest.approx(m2["loss/policy"], rel=1e-5, abs=1e-7)
    for a, b in zip(whole, split, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("agg", list(LOSS_AGGREGATIONS))
def test_groups_learned_ahead_make_the_same_update(model, agg):
    """Two groups' gradients learned ahead, before the batch's other groups (and so its token
    count) exist, then the rest: the one update of the whole batch, KL to a reference included,
    and the same metrics."""
    samples = make_samples(12, group=3)
    algo, optim = AlgorithmConfig(loss_agg=agg, kl_coef=0.1), OptimConfig(lr=1e-3, grad_clip=0)
    adv = [torch.full((len(s.response_ids),), (-1.0) ** i * (i + 1)) for i, s in enumerate(samples)]
    ref = [
        -torch.rand(len(s.response_ids), generator=torch.Generator().manual_seed(i))
        for i, s in enumerate(samples)
    ]
    results = []
    for early in ([], [0, 1, 2, 6, 7, 8]):  # groups u0 and u2
        m = copy.deepcopy(model)
        learner = Learner(m, algo, optim, 1, 24, 1.0, pad_id=0, seed=0, norm_len=16)
        if early:
            tokens = learner.learn_ahead(*([xs[i] for i in early] for xs in (samples, adv, ref)))
            assert tokens == sum(len(samples[i].response_ids) for i in early) + sum(
                len(samples[i].prompt_ids) for i in (0, 6)
            )
        ahead = frozenset(samples[i].key for i in early)
        metrics = learner.learn(samples, adv, ref, ahead=ahead)
        results.append(([p.detach().clone() for p in m.parameters()], metrics))
    (want, want_m), (got, got_m) = results
    for key in ("loss/policy", "kl/mean", "actor/clip_frac", "actor/approx_kl", "grad_norm"):
        assert got_m[key] == pytest.approx(want_m[key], rel=1e-5, abs=1e-7), key
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_gradients_learned_ahead_count_only_when_the_update_names_all_their_samples(model):
    """A rank whose ahead gradients the update does not name (their advantages changed, say)
    drops them and learns its share as if it had learned nothing ahead."""
    samples = make_samples(8)
    adv = [torch.full((len(s.response_ids),), (-1.0) ** i * (i + 1)) for i, s in enumerate(samples)]
    algo, optim = AlgorithmConfig(), OptimConfig(lr=1e-3, grad_clip=0)
    plain = Learner(copy.deepcopy(model), algo, optim, 1, 24, 1.0, pad_id=0, seed=0, norm_len=16)
    want = plain.learn(samples, adv, None)
    dropped = Learner(copy.deepcopy(model), algo, optim, 1, 24, 1.0, pad_id=0, seed=0, norm_len=16)
    dropped.learn_ahead(samples[:2], [-a for a in adv[:2]], None)
    got = dropped.learn(samples, adv, None, ahead=frozenset())
    assert got["loss/policy"] == pytest.approx(want["loss/policy"], rel=1e-6)
    assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
    with pytest.raises(ValueError, match="one update a step"):
        several = Learner(
            copy.deepcopy(model), AlgorithmConfig(epochs=2), optim, 1, 24, 1.0, pad_id=0, seed=0, norm_len=16
        )
        several.learn(samples, adv, None, ahead=frozenset({samples[0].key}))


def test_on_policy_loss_is_minus_the_mean_token_advantage(model):
    """With old log-probs = current (one epoch), ratio = 1: token-mean loss = -mean(A) over tokens."""
    samples = make_samples(4)
    _, metrics = grads_after_one_update(model, samples, budget=10_000, agg="token-mean")
    adv = [(-1.0) ** i * (i + 1) for i in range(4)]
    tokens = [len(s.response_ids) for s in samples]
    want = -sum(a * t for a, t in zip(adv, tokens, strict=True)) / sum(tokens)
    assert metrics["loss/policy"] == pytest.approx(want, rel=1e-5)
    assert metrics["actor/clip_frac"] == 0.0


def test_activation_checkpointing_recomputes_layers_and_leaves_the_update_unchanged():
    """`model.gradient_checkpointing` keeps only each layer's input and runs the layer again in the
    backward pass (the prompt and its group's packed responses run in one pass, with no KV cache
    for a recompute to append to twice)."""
    cfg = ModelConfig(path="tiny", tiny_hidden_size=32, tiny_layers=2)
    samples = make_samples(9, group=3)
    runs = []
    for checkpointing in (False, True):
        model = load_model(dataclasses.replace(cfg, gradient_checkpointing=checkpointing), 64, seed=0)
        calls, act = [], model.base_model.layers[0].mlp.act_fn
        act.forward = lambda x, run=act.forward, calls=calls: (
            calls.append(1) or run(x)
        )  # hooks skip a recompute
        updates, metrics = grads_after_one_update(
            model, samples, budget=10_000, agg="token-mean", copy_model=False
        )
        runs.append((updates, metrics, len(calls)))
    (plain, m_plain, n_plain), (recomputed, m_recomputed, n_recomputed) = runs
    assert n_recomputed == 2 * n_plain
    assert m_recomputed["loss/policy"] == pytest.approx(m_plain["loss/policy"], rel=1e-6)
    for a, b in zip(plain, recomputed, strict=True):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-5)


def full_logits_logprobs(model, mb, temperature):
    """The learner's log-probs as they were computed before chunking: every position's logits over
    the whole vocabulary at once, masked afterwards."""
    logits = model.get_output_embeddings()(response_hidden(model.base_model, mb)).float() / temperature
    chosen = logits.gather(-1, mb.targets.unsqueeze(-1)).squeeze(-1)
    return (chosen - torch.logsumexp(logits, dim=-1)) * mb.mask


def test_chunked_logprobs_and_their_gradients_equal_the_full_logits_ones(model, monkeypatch):
    monkeypatch.setattr(logprobs_module, "LOGIT_CHUNK", 5)  # several chunks, one of them ragged
    samples = make_samples(9, group=3)
    mb = MicroBatch.build(samples, prompt_groups(samples, list(range(9))), pad_id=0)
    weights = torch.randn(mb.mask.shape, generator=torch.Generator().manual_seed(3))
    results = []
    for fn in (response_logprobs, full_logits_logprobs):
        model.zero_grad(set_to_none=True)
        logp = fn(model, mb, 0.7)
        (logp * weights).sum().backward()
        results.append((logp.detach(), [p.grad.clone() for p in model.parameters()]))
    (new, new_grads), (old, old_grads) = results
    torch.testing.assert_close(new, old, atol=1e-6, rtol=1e-5)
    for a, b in zip(new_grads, old_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_the_shuffle_changes_every_step_and_resumes_exactly(model, monkeypatch):
    seeds = []
    order = learner_module.update_order
    monkeypatch.setattr(learner_module, "update_order", lambda *a: seeds.append(a[-1]) or order(*a))
    samples = make_samples(8)
    adv = [torch.full((len(s.response_ids),), float(i % 3 - 1)) for i, s in enumerate(samples)]
    algo, optim = AlgorithmConfig(mini_batches=2), OptimConfig(lr=1e-3, grad_clip=0)

    def learner(m):
        return Learner(m, algo, optim, 3, 10_000, 1.0, pad_id=0, seed=7, norm_len=16)

    first = learner(model)
    for _ in range(2):
        first.learn(samples, adv, None)
    assert len(set(seeds)) == 2
    resumed = learner(copy.deepcopy(model))
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    assert first.learn(samples, adv, None) == resumed.learn(samples, adv, None)
    assert seeds[2] == seeds[3] and len(set(seeds)) == 3
    assert shuffle_seed(7, 0, "policy") != shuffle_seed(7, 0, "critic") != shuffle_seed(8, 0, "critic")


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_lm_heads_recomputing_backward_equals_autograds(temperature, with_bias):
    """`SelectedLogSoftmax` keeps no logits for the backward pass; its values are bit for bit the
    plain formula's and its gradients (hidden states, head weight and bias) autograd's."""
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(7, 16, generator=g, requires_grad=True)
    weight = torch.randn(40, 16, generator=g, requires_grad=True)
    bias = torch.randn(40, generator=g, requires_grad=True) if with_bias else None
    targets = torch.randint(0, 40, (7,), generator=g)
    upstream = torch.randn(7, generator=g)

    def plain(h, w, b):
        logits = torch.nn.functional.linear(h, w, b).float()
        if temperature > 0:
            logits = logits / temperature
        return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)

    inputs = [t for t in (hidden, weight, bias) if t is not None]
    want = plain(hidden, weight, bias)
    want_grads = torch.autograd.grad((want * upstream).sum(), inputs)
    got = logprobs_module.SelectedLogSoftmax.apply(hidden, weight, bias, targets, temperature)
    got_grads = torch.autograd.grad((got * upstream).sum(), inputs)
    assert torch.equal(got, want)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_a_primed_optimizer_learns_bit_for_bit_as_a_fresh_one(model, weight_decay):
    """`prime` makes AdamW's state before the first update (a step at learning rate 0 on zero
    gradients, its step count set back): no parameter moves, and two updates from there equal a
    fresh optimizer's to the bit, moments, step counts and learning rates included."""
    samples = make_samples(8)
    adv = [torch.full((len(s.response_ids),), (-1.0) ** i * (i + 1)) for i, s in enumerate(samples)]
    algo, optim = AlgorithmConfig(), OptimConfig(lr=1e-3, grad_clip=1.0, weight_decay=weight_decay)
    learners = []
    for primed in (False, True):
        learner = Learner(copy.deepcopy(model), algo, optim, 4, 10_000, 1.0, pad_id=0, seed=0, norm_len=16)
        if primed:
            before = [p.detach().clone() for p in learner.model.parameters()]
            learner_module.prime(learner.optimizer)
            assert all(torch.equal(p, b) for p, b in zip(learner.model.parameters(), before, strict=True))
            assert all(p.grad is None for p in learner.model.parameters())
            state = learner.optimizer.state_dict()["state"]
            assert len(state) == len(before) and all(float(s["step"]) == 0 for s in state.values())
        for _ in range(2):
            learner.learn(samples, adv, None)
        learners.append(learner)
    fresh, primed = learners
    for a, b in zip(fresh.model.parameters(), primed.model.parameters(), strict=True):
        assert torch.equal(a, b)
    want, got = fresh.optimizer.state_dict(), primed.optimizer.state_dict()
    assert want["param_groups"] == got["param_groups"]
    for key, moments in want["state"].items():
        for name, value in moments.items():
            assert torch.equal(value, got["state"][key][name]), (key, name)


def test_priming_leaves_an_optimizer_with_state_as_it_is(model):
    """A resumed run's optimizer has its state: priming it changes nothing."""
    learner = Learner(
        model, AlgorithmConfig(), OptimConfig(lr=1e-3), 4, 10_000, 1.0, pad_id=0, seed=0, norm_len=16
    )
    samples = make_samples(4)
    learner.learn(samples, [torch.ones(len(s.response_ids)) for s in samples], None)
    state = copy.deepcopy(learner.optimizer.state_dict())
    learner_module.prime(learner.optimizer)
    after = learner.optimizer.state_dict()
    assert all(
        torch.equal(value, after["state"][key][name])
        for key, moments in state["state"].items()
        for name, value in moments.items()
    )
