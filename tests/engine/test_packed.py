"""Reordered linear weights (`generation.packed_weights`): the same tokens as the plain layers,
new weights reordered again, the model left as it was outside the engine's forwards."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from rlhfless.engine import Engine, Request
from rlhfless.engine.packed import PackedLinears, available
from rlhfless.engine.profiling import measure_profile
from tests.engine.engine_support import one_layer_llama, small_llama
from tests.engine.test_engine import EOS, GREEDY, PAD, SAMPLED, VOCAB, alone, key, prompts

pytestmark = pytest.mark.skipif(not available(), reason="this torch has no oneDNN")


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    torch.set_num_threads(1)
    return small_llama(VOCAB, 512)


def packed_engine(model, **kwargs) -> Engine:
    return Engine(model, eos_token_ids=EOS, pad_token_id=PAD, packed_weights=True, **kwargs)


@pytest.mark.parametrize("params,samples", [(GREEDY, 1), (SAMPLED, 3)], ids=["greedy", "sampled"])
def test_packed_engines_draw_the_tokens_the_plain_layers_draw_alone_batched_and_cut(model, params, samples):
    prompt_list = prompts(6)
    reference = alone(model, prompt_list, params, samples)  # plain layers, one sequence at a time
    requests = [Request(f"p{i}", p, samples) for i, p in enumerate(prompt_list)]
    assert key(packed_engine(model, max_running=4).generate(requests, params, step=3)) == reference
    # cut on a packed engine, resumed on a plain one
    first = packed_engine(model, max_running=4)
    first.add(requests, params, step=3)
    for _ in range(4):
        first.step()
    second = Engine(model, eos_token_ids=EOS, pad_token_id=PAD, max_running=3)
    second.resume(first.cut(with_kv=True), params, step=3)
    assert key(first.take_finished() + second.run()) == reference


def test_inside_the_context_every_linear_runs_on_its_reordered_weight_and_outside_as_before(model):
    ids = torch.tensor([prompts(1)[0]])
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        packed = PackedLinears(model)
        assert packed.active and len(packed.linears) == 2 * 7 + 1  # q k v o gate up down, lm_head
        with packed:
            assert all("forward" in layer.__dict__ for layer in packed.linears)
            inside = model(input_ids=ids).logits
        assert all("forward" not in layer.__dict__ for layer in packed.linears)
        after = model(input_ids=ids).logits
    assert torch.equal(after, plain)
    torch.testing.assert_close(inside, plain, rtol=1e-5, atol=1e-5)


def test_weights_loaded_into_a_packed_engine_are_reordered_again():
    a, b = one_layer_llama(VOCAB, 1), one_layer_llama(VOCAB, 2)
    engine = packed_engine(a)
    request = [Request("a", [9, 10, 11])]
    engine.generate(request, GREEDY, step=0)  # reorders a's weights
    engine.set_weights(torch.nn.utils.parameters_to_vector(b.parameters()), version=5)
    expected = Engine(b, eos_token_ids=EOS, pad_token_id=PAD).generate(request, GREEDY, step=0)
    assert key(engine.generate(request, GREEDY, step=0)) == key(expected)


def test_a_weight_changed_in_place_is_reordered_again_at_the_next_forward():
    """A model shared with a colocated learner: its optimizer writes the weights in place."""
    model = one_layer_llama(VOCAB, 3)
    packed = PackedLinears(model)
    ids = torch.tensor([[9, 10, 11, 12]])
    with torch.no_grad():
        with packed:
            model(input_ids=ids)
        for layer in packed.linears:
            layer.weight.mul_(1.5)
        expected = model(input_ids=ids).logits
        with packed:
            got = model(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_shared_model_updated_by_a_fused_optimizer_is_reordered_again_at_the_next_version():
    """The in-process learner's AdamW is fused: it writes the weights in place without moving
    their version counters, so the engine's new weight version is what says they changed."""
    model = one_layer_llama(VOCAB, 6)
    engine = packed_engine(model)
    request = [Request("a", [9, 10, 11])]
    before = key(engine.generate(request, GREEDY, step=0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5, fused=True)
    model(input_ids=torch.tensor([[9, 10, 11, 12]])).logits.square().mean().backward()
    optimizer.step()
    engine.weight_version = 1  # as the executor says after each update
    expected = Engine(model, eos_token_ids=EOS, pad_token_id=PAD).generate(request, GREEDY, step=0)
    assert key(expected) != before  # the update changed what greedy decoding gives
    assert key(engine.generate(request, GREEDY, step=0)) == key(expected)


def test_copies_made_in_inference_mode_are_reordered_again_outside_it():
    """The engine's forwards run in inference mode, a bare forward under `no_grad` may follow."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(24, 40)
    packed, x = PackedLinears(layer), torch.randn(3, 24)
    with torch.inference_mode(), packed:
        layer(x)
    with torch.no_grad():
        layer.weight.mul_(2.0)
        with packed:
            got = layer(x)
    torch.testing.assert_close(got, torch.nn.functional.linear(x, layer.weight, layer.bias))


def test_a_bias_is_added_as_the_plain_layer_adds_it():
    torch.manual_seed(0)
    layer = torch.nn.Linear(24, 40, bias=True)
    x = torch.randn(3, 5, 24)
    with torch.no_grad(), PackedLinears(layer):
        got = layer(x)
    torch.testing.assert_close(got, torch.nn.functional.linear(x, layer.weight, layer.bias))


def test_only_float32_cpu_linear_layers_of_an_enabled_engine_are_reordered(model):
    assert not PackedLinears(model, enabled=False).active
    assert not PackedLinears(one_layer_llama(VOCAB, 4).to(torch.bfloat16)).active

    class Special(torch.nn.Linear):  # a quantized layer, say: its own forward
        pass

    assert not PackedLinears(torch.nn.Sequential(Special(4, 4))).active
    assert not Engine(model, eos_token_ids=EOS, pad_token_id=PAD).linears.active


def test_a_profile_times_the_forwards_as_a_packed_engine_runs_them(model):
    from rlhfless.runtime import machine

    table = measure_profile(
        model, batches=[1, 4], contexts=[8], prefill_tokens=[16], repeats=1, packed_weights=True
    )
    assert all(entry["ms"] > 0 for entry in table["decode"] + table["prefill"])
    # a table measured on plain layers is not read back for reordered ones
    assert machine.cache_key(model, 1, packed=True) != machine.cache_key(model, 1)
    bf16 = one_layer_llama(VOCAB, 5).to(torch.bfloat16)  # nothing to reorder: the same table
    assert machine.cache_key(bf16, 1, packed=True) == machine.cache_key(bf16, 1)


def test_without_onednn_every_layer_runs_as_it_is(model, monkeypatch):
    available.cache_clear()
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    try:
        assert not available()
        assert not PackedLinears(model).active
    finally:
        available.cache_clear()  # what this torch really has, for the tests after
