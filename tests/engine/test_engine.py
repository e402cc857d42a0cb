"""The generation engine: same tokens wherever a sequence runs, prefill work counted, caches versioned."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import LlamaForCausalLM

from rlhfless.engine import (
    Engine,
    PrefixKV,
    PrefixTree,
    Request,
    SamplingParams,
    SequenceResult,
    StaleCacheError,
    rollout,
)
from rlhfless.engine.forward import decode_span
from tests.engine.engine_support import one_layer_llama, small_llama

VOCAB = 256
PAD = 0
EOS = list(range(1, 9))  # 8 of 256 tokens end a sequence: lengths vary under sampling
GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0)
SAMPLED = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.9, seed=7)


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    torch.set_num_threads(1)  # tiny matrices: extra threads only add contention on shared CPUs
    return small_llama(VOCAB, 512)


def make_engine(model, **kwargs) -> Engine:
    return Engine(model, eos_token_ids=EOS, pad_token_id=PAD, **kwargs)


def prompts(n: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(9, VOCAB, (int(torch.randint(3, 14, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


def key(results: list[SequenceResult]) -> dict:
    return {(r.uid, r.sample): (r.response_ids, r.finish_reason) for r in results}


def alone(model, prompt_list, params, samples=1) -> dict:
    out = {}
    for i, p in enumerate(prompt_list):
        for s in range(samples):
            req = Request(f"p{i}", p, 1, sample_indices=[s])
            out.update(key(make_engine(model).generate([req], params, step=3)))
    return out


def cut_and_resume(model, requests, params, k: int, with_kv: bool) -> dict:
    first = make_engine(model, max_running=4)
    first.add(requests, params, step=3)
    for _ in range(k):
        first.step()
    states = first.cut(with_kv=with_kv)
    assert states, "the cut must catch unfinished sequences"
    assert any(st.generated_ids for st in states)
    second = make_engine(model, max_running=3)
    second.resume(states, params, step=3)
    return key(first.take_finished() + second.run())


CUDA = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("params,samples", [(GREEDY, 1), (SAMPLED, 3)], ids=["greedy", "sampled"])
def test_same_tokens_alone_in_a_mixed_batch_and_after_cut_and_resume(model, params, samples, device):
    model = model if device == "cpu" else copy.deepcopy(model).to(device)
    prompt_list = prompts(6)
    reference = alone(model, prompt_list, params, samples)
    requests = [Request(f"p{i}", p, samples) for i, p in enumerate(prompt_list)]
    # half join while the other half is 3 tokens in; max_running=4 makes the rest queue for slots
    engine = make_engine(model, max_running=4)
    engine.add(requests[:3], params, step=3)
    for _ in range(3):
        engine.step()
    engine.add(requests[3:], params, step=3)
    assert key(engine.run()) == reference
    assert cut_and_resume(model, requests, params, k=4, with_kv=False) == reference
    assert cut_and_resume(model, requests, params, k=4, with_kv=True) == reference


@given(longest=st.integers(0, 100_000), quantum=st.integers(1, 512))
def test_a_decode_span_is_the_next_multiple_of_the_quantum_past_the_longest_sequence(longest, quantum):
    span = decode_span(longest, quantum)
    assert span % quantum == 0 and longest + 1 <= span < longest + 1 + quantum


@pytest.mark.parametrize("quantum", [5, 64])
def test_a_rounded_decode_span_draws_the_same_tokens_as_the_exact_one(model, quantum):
    """Rounding a decode step's attention span up (the mask hides the extra positions) changes no
    token: the span is an engine's speed knob, never a sample's."""
    requests = [Request(f"p{i}", p, 3) for i, p in enumerate(prompts(6))]
    exact = key(make_engine(model, span_quantum=1, max_running=4).generate(requests, SAMPLED, step=3))
    assert (
        key(make_engine(model, span_quantum=quantum, max_running=4).generate(requests, SAMPLED, step=3))
        == exact
    )


def test_the_span_quantum_is_a_positive_count(model):
    with pytest.raises(ValueError, match="span_quantum: got 0"):
        make_engine(model, span_quantum=0)


@pytest.mark.parametrize("threads", [2, 3])
def test_same_tokens_whatever_the_torch_thread_count(model, threads):
    """Another thread count sums the matmuls in another order; the sampled tokens stay the same."""
    requests = [Request(f"p{i}", p, 3) for i, p in enumerate(prompts(6))]
    reference = key(make_engine(model).generate(requests, SAMPLED, step=3))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert key(make_engine(model, max_running=5).generate(requests, SAMPLED, step=3)) == reference
    finally:
        torch.set_num_threads(before)


def test_greedy_matches_hugging_face_generate(model):
    prompt = prompts(1, seed=5)[0]
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    [result] = make_engine(model).generate([Request("a", prompt)], params, step=0)
    expected = model.generate(
        torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=EOS, pad_token_id=PAD
    )[0, len(prompt) :].tolist()
    assert result.response_ids == expected


def test_logprobs_are_of_the_temperature_scaled_distribution(model):
    prompt = prompts(1, seed=6)[0]
    params = SamplingParams(max_new_tokens=6, temperature=0.7, seed=3)
    [result] = make_engine(model).generate([Request("a", prompt)], params, step=0)
    ids = torch.tensor([prompt + result.response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1]
    expected = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, torch.tensor(result.response_ids)[:, None])[
        :, 0
    ]
    torch.testing.assert_close(torch.tensor(result.logprobs), expected, atol=1e-4, rtol=1e-4)


def test_samples_of_a_prompt_differ_and_depend_on_seed_and_step(model):
    prompt = prompts(1, seed=8)[0]
    run = lambda seed, step: key(  # noqa: E731
        make_engine(model).generate([Request("a", prompt, 4)], SamplingParams(12, seed=seed), step)
    )
    base = run(0, 0)
    assert len({tuple(v[0]) for v in base.values()}) > 1
    assert run(0, 0) == base
    assert run(1, 0) != base and run(0, 1) != base


SYSTEM = [20, 21, 22, 23, 24, 25, 26, 27]
BODIES = [[30, 31, 32, 33], [40, 41, 42, 43, 44, 45], [50, 51, 52, 53, 54]]


def test_dedup_on_and_off_give_the_same_sequences_and_count_prompt_tokens(model):
    group = [(f"q{i}", SYSTEM + body) for i, body in enumerate(BODIES)]  # lengths 12, 14, 13
    tree = PrefixTree([SYSTEM], [-1], {uid: 0 for uid, _ in group})
    on, on_stats = rollout(make_engine(model), group, 4, SAMPLED, step=2, tree=tree)
    off, off_stats = rollout(make_engine(model), group, 4, SAMPLED, step=2, tree=None)
    assert key(on) == key(off)
    assert [(r.uid, r.sample) for r in on] == [(f"q{i}", g) for i in range(3) for g in range(4)]
    # dedup: the 8-token system prompt once, then each prompt's own 4 + 6 + 5 tokens once
    assert (on_stats.prompt_tokens_computed, on_stats.unique_prefixes) == (8 + 15, 1)
    assert on_stats.prompt_tokens_naive == 4 * (12 + 14 + 13)
    assert off_stats.prompt_tokens_computed == off_stats.prompt_tokens_naive == 4 * (12 + 14 + 13)
    assert on_stats.metrics()["prefill/tokens_computed"] == 23


TASK = [60, 61, 62]  # a second level: a task's instruction after the shared system prompt
LEVELED = [
    ("a", SYSTEM + TASK + [70, 71]),
    ("b", SYSTEM + TASK + [72]),
    ("c", SYSTEM + TASK),  # the second level is this whole prompt
    ("d", SYSTEM + [80, 81, 82, 83]),
    ("e", [90, 91, 92]),  # shares nothing
]


def test_a_child_levels_kv_computed_from_its_parents_is_the_whole_prefixs_kv(model):
    engine = make_engine(model)
    system, task = engine.prefill([SYSTEM, SYSTEM + TASK], parents=[-1, 0])
    [scratch] = make_engine(model).prefill([SYSTEM + TASK])
    assert task.token_ids == SYSTEM + TASK and engine.stats.prompt_tokens_computed == 8 + 3
    for a, b in zip(task.keys + task.values, scratch.keys + scratch.values, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="parents"):
        engine.prefill([SYSTEM, [1] + TASK], parents=[-1, 0])


def test_prefix_tree_levels_give_the_same_sequences_as_one_level_and_as_no_dedup(model):
    """The system prompt once, the task's instruction once from its KV, each prompt's own part
    once; the paper's single level (whole prompts) and no dedup sample the same tokens."""
    tree = PrefixTree([SYSTEM, SYSTEM + TASK], [-1, 0], {"a": 1, "b": 1, "c": 1, "d": 0})
    paper = PrefixTree([ids for _, ids in LEVELED], [-1] * 5, {uid: i for i, (uid, _) in enumerate(LEVELED)})
    runs = {
        name: rollout(make_engine(model), LEVELED, 3, SAMPLED, step=4, tree=t)
        for name, t in (("tree", tree), ("paper", paper), ("off", None))
    }
    assert key(runs["tree"][0]) == key(runs["paper"][0]) == key(runs["off"][0])
    few_slots = rollout(make_engine(model, max_running=4), LEVELED, 3, SAMPLED, step=4, tree=tree)[0]
    assert key(few_slots) == key(runs["off"][0])
    lengths = [len(ids) for _, ids in LEVELED]
    # the tree: 8 + 3 by the levels; a 2, b 1, c its last token again, d 4, e 3 by the prompts
    assert runs["tree"][1].prompt_tokens_computed == 8 + 3 + (2 + 1 + 1 + 4 + 3)
    assert runs["paper"][1].prompt_tokens_computed == sum(lengths) + 5  # every last token twice
    assert runs["off"][1].prompt_tokens_computed == 3 * sum(lengths)


def test_a_prefix_tree_must_build_on_earlier_shorter_prefixes():
    with pytest.raises(ValueError, match="an earlier node"):
        PrefixTree([SYSTEM], [0], {})
    with pytest.raises(ValueError, match="its parent's tokens"):
        PrefixTree([SYSTEM + TASK, SYSTEM], [-1, 0], {})
    with pytest.raises(ValueError, match="its parent's tokens"):
        PrefixTree([SYSTEM, TASK + [1]], [-1, 0], {})
    with pytest.raises(ValueError, match="node_of"):
        PrefixTree([SYSTEM], [-1], {"a": 1})
    assert PrefixTree([SYSTEM, SYSTEM + TASK], [-1, 0], {}).computed_tokens() == 11


def test_prefix_as_long_as_the_prompt_still_computes_its_last_token(model):
    engine = make_engine(model)
    prompt = SYSTEM + BODIES[0]
    [kv] = engine.prefill([prompt])
    with_prefix = engine.generate([Request("a", prompt, 2, prefix=kv)], GREEDY, step=0)
    assert engine.stats.prompt_tokens_computed == len(prompt) + 1
    assert key(with_prefix) == key(make_engine(model).generate([Request("a", prompt, 2)], GREEDY, step=0))


def test_a_cache_from_an_older_weight_version_is_refused(model):
    engine = make_engine(model)
    [kv] = engine.prefill([SYSTEM])
    engine.set_weights(model.state_dict(), version=1)
    with pytest.raises(StaleCacheError, match="weight version 0"):
        engine.add([Request("a", SYSTEM + BODIES[0], 1, prefix=kv)], GREEDY, step=0)
    [fresh] = engine.prefill([SYSTEM])
    assert fresh.weight_version == 1
    engine.add([Request("a", SYSTEM + BODIES[0], 1, prefix=fresh)], GREEDY, step=0)
    with pytest.raises(RuntimeError, match="still running"):
        engine.set_weights(model.state_dict(), version=2)


def test_set_weights_from_a_flat_vector_changes_the_model_output():
    a, b = one_layer_llama(VOCAB, 1), one_layer_llama(VOCAB, 2)
    engine = make_engine(a)
    flat = torch.nn.utils.parameters_to_vector(b.parameters())
    engine.set_weights(flat, version=5)
    expected = make_engine(b).generate([Request("a", [9, 10, 11])], GREEDY, step=0)
    assert key(engine.generate([Request("a", [9, 10, 11])], GREEDY, step=0)) == key(expected)
    assert engine.weight_version == 5


def test_prefix_kv_survives_pickling(model):
    engine = make_engine(model)
    [kv] = engine.prefill([SYSTEM + BODIES[1]])
    short = kv.truncated(8)
    copy = pickle.loads(pickle.dumps(short))
    assert copy.token_ids == SYSTEM and copy.weight_version == 0
    assert copy.nbytes == short.nbytes == 2 * 2 * 2 * 8 * 16 * 4  # k+v, layers, kv heads, tokens, dim, fp32
    for a, b in zip(copy.keys + copy.values, short.keys + short.values, strict=True):
        assert torch.equal(a, b)
    prompt = SYSTEM + BODIES[2]
    got = engine.generate([Request("a", prompt, 2, prefix=copy)], SAMPLED, step=1)
    assert key(got) == key(make_engine(model).generate([Request("a", prompt, 2)], SAMPLED, step=1))


def test_prefix_must_match_the_prompt(model):
    [kv] = make_engine(model).prefill([SYSTEM])
    with pytest.raises(ValueError, match="not a prefix"):
        Request("a", BODIES[0] + SYSTEM, 1, prefix=kv)
    with pytest.raises(ValueError, match="empty prefix"):
        make_engine(model).prefill([SYSTEM, []])
    with pytest.raises(ValueError, match="shape"):
        PrefixKV([1, 2], [torch.zeros(2, 3, 4)], [torch.zeros(2, 3, 4)], 0)


def test_progress_and_limits_while_decoding(model):
    long = SamplingParams(max_new_tokens=8, temperature=0.0)
    engine = make_engine(model, max_running=3, max_kv_tokens=2 * (10 + 8) + 17)
    engine.add([Request(f"p{i}", list(range(20 + i, 30 + i))) for i in range(5)], long, step=0)
    peak = 0
    while True:
        progress = engine.progress()
        assert progress.running + progress.queued + progress.finished == progress.total == 5
        assert progress.free_slots == 3 - progress.running
        if not progress.running and not progress.queued:
            break
        engine.step()
        peak = max(peak, engine.progress().running)
    assert peak == 2  # the KV budget holds two sequences of 10 prompt + 8 new tokens, not three
    assert len(engine.take_finished()) == 5


def test_run_until_stops_at_a_finished_share(model):
    engine = make_engine(model)
    engine.add([Request(f"p{i}", p, 2) for i, p in enumerate(prompts(4))], SAMPLED, step=0)
    done = engine.run(until=lambda p: p.finished >= 0.5 * p.total)
    peeked = engine.unfinished()
    assert [(s.uid, s.sample) for s in engine.unfinished()] == [(s.uid, s.sample) for s in peeked]
    left = engine.cut()
    assert [(s.uid, s.sample, s.generated_ids) for s in left] == [
        (s.uid, s.sample, s.generated_ids) for s in peeked
    ]
    assert engine.progress().running == engine.progress().queued == 0
    assert len(done) >= 4 and len(done) + len(left) == 8
    assert all(r.finish_reason in ("stop", "length") for r in done)


def test_stats_count_decode_work(model):
    engine = make_engine(model, max_running=8)
    results = engine.generate([Request(f"p{i}", p) for i, p in enumerate(prompts(3))], GREEDY, step=0)
    tokens = sum(len(r.response_ids) for r in results)
    assert engine.stats.tokens_generated == tokens
    assert engine.stats.decode_steps == max(len(r.response_ids) for r in results) - 1
    assert all(len(r.logprobs) == len(r.response_ids) for r in results)
    assert all(r.finish_reason == ("stop" if r.response_ids[-1] in EOS else "length") for r in results)
