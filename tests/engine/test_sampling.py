"""The counter-based sampler: randomness is a pure function of the sequence's keys."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlhfless.engine.sampling import SamplingParams, sample_tokens, sequence_key, uniforms


def test_uniforms_are_a_pure_function_of_key_and_position():
    keys = np.array(
        [sequence_key(0, 1, "a", 0), sequence_key(0, 1, "a", 1), sequence_key(0, 1, "b", 0)], np.uint64
    )
    u = uniforms(keys, np.array([5, 5, 5], np.uint64))
    assert len(set(u.tolist())) == 3
    assert uniforms(keys[::-1], np.array([5, 5, 5], np.uint64)).tolist() == u[::-1].tolist()
    assert uniforms(keys[:1], np.array([6], np.uint64))[0] != u[0]
    assert sequence_key(0, 1, "a", 0) != sequence_key(1, 1, "a", 0) != sequence_key(0, 2, "a", 0)
    many = uniforms(np.full(20000, keys[0]), np.arange(20000, dtype=np.uint64))
    assert 0 <= many.min() and many.max() < 1 and abs(many.mean() - 0.5) < 0.01


def draw(logits: torch.Tensor, params: SamplingParams, n: int) -> np.ndarray:
    keys = np.array([sequence_key(params.seed, 0, f"u{i}", 0) for i in range(n)], np.uint64)
    tokens, _ = sample_tokens(logits.expand(n, -1), params, uniforms(keys, np.zeros(n, np.uint64)))
    return np.bincount(tokens.numpy(), minlength=logits.shape[-1]) / n


def test_sampling_follows_the_tempered_and_nucleus_filtered_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()[None]
    freq = draw(logits, SamplingParams(1), 8000)
    np.testing.assert_allclose(freq, probs.numpy(), atol=0.02)
    tempered = torch.softmax(logits[0] / 0.5, dim=-1).numpy()
    np.testing.assert_allclose(draw(logits, SamplingParams(1, temperature=0.5), 8000), tempered, atol=0.02)
    # top_p=0.7 keeps the two most likely tokens (0.5 + 0.3 >= 0.7), renormalised
    np.testing.assert_allclose(
        draw(logits, SamplingParams(1, top_p=0.7), 8000), [0.625, 0.375, 0, 0], atol=0.02
    )


def test_greedy_takes_the_argmax_and_reports_its_logprob():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    tokens, logprobs = sample_tokens(logits, SamplingParams(1, temperature=0), np.zeros(2))
    assert tokens.tolist() == [1, 0]
    torch.testing.assert_close(logprobs, torch.log_softmax(logits, -1).max(-1).values)


@pytest.mark.parametrize("field,value", [("max_new_tokens", 0), ("temperature", -1.0), ("top_p", 0.0)])
def test_invalid_params_are_rejected(field, value):
    kwargs = {"max_new_tokens": 4, field: value}
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)
