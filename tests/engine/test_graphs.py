"""Decode steps of fixed shapes, and their CUDA graphs: padding and the wider span change no token,
new weights land where the graphs read them, and the forward holds no op a capture refuses."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from rlhfless.engine import Engine, Request
from rlhfless.engine.forward import attention_mask_kind
from rlhfless.engine.graphs import StaticDecode, bucket
from rlhfless.engine.kv import SlotCache
from rlhfless.engine.weights import copy_into_parameters
from tests.engine.engine_support import small_llama
from tests.engine.test_engine import PAD, SAMPLED, VOCAB, key, make_engine, prompts


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return small_llama(VOCAB, 512)


@given(batch=st.integers(1, 300), most=st.integers(1, 300))
def test_a_step_is_padded_to_the_next_power_of_two_within_the_engines_slots(batch, most):
    size = bucket(batch, most)
    assert size >= batch
    assert size == batch or size <= most
    assert size & (size - 1) == 0 or size == most or size == batch


def test_padded_fixed_shape_decode_steps_draw_the_same_tokens_as_exact_ones(model):
    """What a CUDA graph replays: the batch padded to a bucket (6 slots: 4 sequences pad to 4, 5 to
    6) and the span the cache's whole capacity. Neither changes a token, nor a log-prob beyond
    float rounding."""
    requests = [Request(f"p{i}", p, 3) for i, p in enumerate(prompts(6))]
    exact = make_engine(model, max_running=6).generate(requests, SAMPLED, step=3)
    engine = make_engine(model, max_running=6, static_decode=True)
    fixed = engine.generate(requests, SAMPLED, step=3)
    assert key(fixed) == key(exact)
    for a, b in zip(fixed, exact, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert engine.stats.decode_steps > 0 and engine.static is not None and engine.static.captured == 0


@pytest.mark.parametrize("static", [False, True])
def test_fixed_shapes_reserve_each_whole_response_at_admission(model, static):
    """So the cache's capacity, a graph's span, holds while they decode; an exact-shape engine
    grows it as responses do (here past 128 positions)."""
    engine = Engine(model, eos_token_ids=[-1], pad_token_id=PAD, static_decode=static)
    engine.add([Request("p0", prompts(1)[0], 2)], replace(SAMPLED, max_new_tokens=130), step=3)
    engine.step()
    buffers = engine.slots.version
    assert all(len(r.response_ids) == 130 for r in engine.run())
    assert (engine.slots.version == buffers) is static


class Replaying:
    """`cuda_capture`'s stand-in on a CPU: a replay reruns the captured forward into the buffer
    the capture returned, reading whatever its static inputs, the cache and the weights hold then,
    as a CUDA graph's replay does."""

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.captures, self.replays = fail, 0, 0

    def __call__(self, forward):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.captures += 1
        out = forward()

        def replay() -> None:
            self.replays += 1
            out.copy_(forward())

        return out.clone(), replay, out


def test_replayed_decode_steps_draw_the_same_tokens_and_capture_each_shape_once(model):
    """The engine's graph path (static inputs copied in, padding rows, one capture per shape,
    replays), with a CPU stand-in for the capture; also after new weights, which land in the
    parameters' storage and are replayed from there."""
    model = copy.deepcopy(model)
    requests = [Request(f"p{i}", p, 3) for i, p in enumerate(prompts(6))]
    eager = make_engine(model, max_running=6)
    engine = make_engine(model, max_running=6, static_decode=True)
    engine.static.capture = capture = Replaying()
    before = key(eager.generate(requests, SAMPLED, step=3))
    assert key(engine.generate(requests, SAMPLED, step=3)) == before
    shapes = engine.static.captured
    assert capture.captures == shapes and capture.replays > 2 * shapes
    vector = torch.nn.utils.parameters_to_vector(model.parameters()).detach() * 1.5
    where = [p.data_ptr() for p in model.parameters()]
    engine.set_weights(vector, version=1)
    assert [p.data_ptr() for p in model.parameters()] == where
    after = key(engine.generate(requests, SAMPLED, step=3))
    assert after == key(eager.generate(requests, SAMPLED, step=3)) != before
    assert capture.captures == shapes  # the same shapes, replayed with the new weights


def test_a_shape_captured_on_old_cache_buffers_is_dropped_once_they_grow(model):
    config = model.config
    slots = SlotCache(config.num_hidden_layers, config.num_key_value_heads, 16, torch.float32, "cpu")
    static = StaticDecode(model, slots, attention_mask_kind(model), most=8, capture=Replaying())
    tokens, positions = torch.tensor([5, 6, 7]), torch.tensor([3, 9, 20])
    with torch.inference_mode():
        first = static(tokens, positions, span=21)
        again = static(tokens, positions, span=21)
        assert torch.equal(first, again) and static.capture.replays == 1
        static(tokens, positions, span=300)  # the cache grows: new buffers
    assert static.captured == 1 and static.capture.captures == 2


def test_a_capture_that_fails_leaves_the_engine_decoding_eagerly(model, caplog):
    requests = [Request(f"p{i}", p, 3) for i, p in enumerate(prompts(6))]
    exact = key(make_engine(model, max_running=6).generate(requests, SAMPLED, step=3))
    engine = make_engine(model, max_running=6, static_decode=True)
    engine.static.capture = Replaying(fail=True)
    assert key(engine.generate(requests, SAMPLED, step=3)) == exact
    assert not engine.static.graphs and engine.static.captured == 0
    assert "capture failed" in caplog.text


def test_cuda_graphs_need_a_model_on_a_cuda_device(model):
    with pytest.raises(ValueError, match="cuda_graphs: the model is on cpu"):
        make_engine(model, cuda_graphs=True)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_decode_steps_replayed_as_cuda_graphs_draw_the_same_tokens(model):
    """Each decode shape captured once and replayed, also after new weights (copied into the
    parameters' storage, which the graphs read)."""
    model = copy.deepcopy(model).to("cuda")
    requests = [Request(f"p{i}", p, 3) for i, p in enumerate(prompts(6))]
    eager = make_engine(model, max_running=6)
    engine = make_engine(model, max_running=6, cuda_graphs=True)
    before = key(eager.generate(requests, SAMPLED, step=3))
    assert key(engine.generate(requests, SAMPLED, step=3)) == before
    assert engine.static.graphs and engine.static.captured > 0
    captured = engine.static.captured
    weights = torch.nn.utils.parameters_to_vector(model.parameters()).detach() * 1.5
    engine.set_weights(weights, version=1)
    after = key(engine.generate(requests, SAMPLED, step=3))
    assert after == key(eager.generate(requests, SAMPLED, step=3)) != before
    assert engine.static.captured == captured  # the same shapes, replayed with the new weights


def test_new_weights_copied_into_the_parameters_storage_keep_it(model):
    model = copy.deepcopy(model)
    where = [p.data_ptr() for p in model.parameters()]
    vector = torch.nn.utils.parameters_to_vector(model.parameters()).detach() + 1
    copy_into_parameters(model, vector)
    assert [p.data_ptr() for p in model.parameters()] == where
    assert torch.equal(torch.nn.utils.parameters_to_vector(model.parameters()), vector)
    with pytest.raises(ValueError, match="weights: got 3 values"):
        copy_into_parameters(model, torch.zeros(3))


class HostSyncs(TorchDispatchMode):
    """Records the ops that make the host wait for the device (a capture fails on them)."""

    SYNCS = ("_local_scalar_dense", "nonzero", "is_nonzero", "masked_select", "unique", "lift_fresh")

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(name in str(func) for name in self.SYNCS):
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_captured_decode_forward_never_waits_on_the_device(model):
    """A CUDA graph capture refuses a host sync (`.item()`, `nonzero`, a tensor from Python data):
    the forward a graph replays, padding included, has none. (The sampler after it has, and stays
    outside the graph.)"""
    config = model.config
    slots = SlotCache(config.num_hidden_layers, config.num_key_value_heads, 16, torch.float32, "cpu")
    static = StaticDecode(model, slots, attention_mask_kind(model), most=8, capture=None)
    tokens, positions = torch.tensor([5, 6, 7]), torch.tensor([3, 9, 20])
    with torch.inference_mode(), HostSyncs() as syncs:
        logits = static(tokens, positions, span=21)
    assert logits.shape == (3, config.vocab_size) and slots.slots == 4  # padded to the bucket
    assert syncs.seen == []
    with torch.inference_mode(), HostSyncs() as syncs:
        torch.tensor([1, 2]).nonzero()
    assert syncs.seen  # it does see one
