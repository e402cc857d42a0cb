"""`runtime.device`: chosen once, with the dtype that goes with it, and every model on it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlhfless.cli import main
from rlhfless.config import ConfigError, load_config
from rlhfless.devices import learner_device, param_dtype, resolve_device
from rlhfless.engine.sampling import SamplingParams
from rlhfless.engine.sequences import Request
from rlhfless.models import load_model, load_tokenizer
from rlhfless.runtime.executor import cuda_graphs
from rlhfless.runtime.functions import DecodeFunction
from rlhfless.runtime.samples import Sample
from rlhfless.runtime.trainer import build_executor
from rlhfless.runtime.transfer import flat_weights

CUDA = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")


def tiny(*overrides: str):
    return load_config(preset="tiny", overrides=("trainer.progress=false", *overrides))


def test_auto_is_cuda_where_torch_sees_a_gpu_with_float32_weights_on_every_device():
    """Weights, and so rollouts, stay float32 on a GPU too (in bfloat16 a schedule would change
    samples); there the learner computes in bfloat16 when `compute_dtype` is auto."""
    cfg = tiny()
    assert (cfg.runtime.device, cfg.model.dtype) == ("auto", "auto")
    on_gpu = resolve_device(cfg, cuda_available=True)
    assert (on_gpu.runtime.device, on_gpu.model.dtype) == ("cuda", "float32")
    learns = resolve_device(tiny("model.compute_dtype=auto"), cuda_available=True).model
    assert (learns.dtype, learns.compute_dtype) == ("float32", "bfloat16")
    on_cpu = resolve_device(cfg, cuda_available=False)
    assert (on_cpu.runtime.device, on_cpu.model.dtype) == ("cpu", "float32")
    assert resolve_device(on_gpu, cuda_available=True) == on_gpu  # resolving twice changes nothing
    pinned = resolve_device(tiny("model.dtype=bfloat16", "runtime.device=cuda"), cuda_available=True)
    assert (pinned.runtime.device, pinned.model.dtype) == ("cuda", "bfloat16")
    assert param_dtype("auto") == "float32" and param_dtype("bfloat16") == "bfloat16"


@NO_CUDA
def test_auto_resolves_to_the_cpu_on_this_machine():
    cfg = resolve_device(tiny())
    assert (cfg.runtime.device, cfg.model.dtype) == ("cpu", "float32")
    assert learner_device(cfg.runtime.device) == "cpu"


def test_cuda_without_a_gpu_is_a_one_line_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"^config error: runtime\.device: got 'cuda', expected"):
        resolve_device(tiny("runtime.device=cuda"), cuda_available=False)
    with pytest.raises(ConfigError, match=r"runtime\.device: got 'tpu', expected one of auto, cpu, cuda"):
        tiny("runtime.device=tpu")
    with pytest.raises(ConfigError, match=r"model\.dtype: got 'float16', expected one of auto"):
        tiny("model.dtype=float16")


@NO_CUDA
def test_train_on_cuda_without_a_gpu_stops_before_writing(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--preset", "tiny", f"output_dir={out}", "runtime.device=cuda"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "runtime.device: got 'cuda'" in err
    assert not out.exists()


def samples(vocab: int) -> list[Sample]:
    g = torch.Generator().manual_seed(0)
    out = []
    for p in range(3):
        prompt = torch.randint(3, vocab, (5 + p,), generator=g).tolist()
        for s in range(2):
            response = torch.randint(3, vocab, (4 + s + p,), generator=g).tolist()
            out.append(Sample(f"p{p}", s, prompt, response, "length", "x", reward=float(s)))
    return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_every_model_its_kv_and_its_updates_live_on_the_chosen_device(device):
    """PPO with a KL loss: the policy, the reference, the critic, the prefill/decode engine and its
    slots, and the updates, all on the device, in its dtype; results come back on the CPU."""
    cfg = resolve_device(tiny(f"runtime.device={device}", "algorithm.name=ppo", "algorithm.kl_coef=0.1"))
    dtype = getattr(torch, cfg.model.dtype)
    tokenizer = load_tokenizer(cfg.model)
    policy = load_model(cfg.model, len(tokenizer), cfg.seed, learner_device(cfg.runtime.device))
    executor = build_executor(cfg, tokenizer, policy)
    models = {"policy": policy, "reference": executor.reference, "critic": executor.critic.model}
    for name, model in models.items():
        kinds = {(p.device.type, p.dtype) for p in model.parameters()}
        assert kinds == {(device, dtype)}, name
    engine = executor.engine
    engine.generate([Request("u", [5, 6, 7], 2)], SamplingParams(max_new_tokens=4, seed=1), step=1)
    assert {(k.device.type, k.dtype) for k in engine.slots.keys} == {(device, dtype)}
    batch = samples(len(tokenizer))
    ref = executor.learner.logprobs(executor.reference, batch)
    rewards = [torch.zeros(len(s.response_ids)).index_fill_(0, torch.tensor([-1]), s.reward) for s in batch]
    advantages, metrics = executor.critic_update(batch, rewards)
    before = flat_weights(policy).copy()
    learned = executor.learn(batch, advantages, ref)
    assert {t.device.type for t in ref + advantages} == {"cpu"}
    assert np.isfinite(metrics["loss/value"]) and np.isfinite(learned["loss/policy"])
    assert not np.array_equal(before, flat_weights(policy))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_two_learners_from_one_state_on_one_batch_learn_the_same_bits(device):
    """Two runs of one schedule train the same weights, or their next samples differ: PPO with a
    KL loss, twice from the same weights. (On a GPU the learner's kernels are the deterministic
    ones, `runtime.precision.deterministic`; racy ones differ in the last bits.)"""
    cfg = resolve_device(tiny(f"runtime.device={device}", "algorithm.name=ppo", "algorithm.kl_coef=0.1"))
    tokenizer = load_tokenizer(cfg.model)
    batch = samples(len(tokenizer))
    learned = []
    for _ in range(2):
        torch.manual_seed(cfg.seed)  # the critic's head is drawn at random
        policy = load_model(cfg.model, len(tokenizer), cfg.seed, learner_device(cfg.runtime.device))
        executor = build_executor(cfg, tokenizer, policy)
        ref = executor.learner.logprobs(executor.reference, batch)
        rewards = [torch.full((len(s.response_ids),), s.reward) for s in batch]
        advantages, _ = executor.critic_update(batch, rewards)
        executor.learn(batch, advantages, ref)
        learned.append((flat_weights(policy), flat_weights(executor.critic.model)))
    assert np.array_equal(learned[0][0], learned[1][0])
    assert np.array_equal(learned[0][1], learned[1][1])


def test_a_decode_function_puts_its_model_and_kv_on_its_device_and_hands_kv_over_on_the_cpu():
    cfg = resolve_device(tiny("runtime.device=cpu"))
    tokenizer = load_tokenizer(cfg.model)
    fn = DecodeFunction(cfg.model, len(tokenizer), cfg.seed, [tokenizer.eos_token_id], 0, 8, 1, "cpu")
    fn.hello()  # the model loads here, after the pool has seen where the function runs
    fn.sync(flat_weights(load_model(cfg.model, len(tokenizer), cfg.seed)), 0)
    fn.assign([("u", [5, 6, 7], [0, 1], None)], None, SamplingParams(max_new_tokens=8, seed=1), 1, [])
    fn.engine.step()
    fn.engine.step()
    moved, _ = fn.cut([[("u", 0), ("u", 1)]], with_kv=True)
    assert moved and all(s.kv is not None and s.kv.keys[0].device.type == "cpu" for s in moved)


def decode_function(cfg, vocab: int, eos: int, device: str, flat: np.ndarray) -> DecodeFunction:
    fn = DecodeFunction(cfg.model, vocab, cfg.seed, [eos], 0, 4, 1, device)
    fn.hello()
    fn.sync(flat, 0)
    return fn


def finish(fn: DecodeFunction) -> dict:
    out = {}
    while True:
        report = fn.advance(60.0)
        out |= {(r.uid, r.sample): r.response_ids for r in report.results}
        if not report.live:
            return out


@pytest.mark.parametrize("target", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_functions_sample_the_same_tokens_on_any_device_even_migrated_mid_decode(target):
    """The same seed gives the same tokens on a CPU and a `target` function, and for sequences cut
    from a CPU function with their KV and resumed on the `target` one (float32 on both: the noise
    is device-independent, and float32 logits differ too little to flip a Gumbel-max)."""
    cfg = resolve_device(tiny("runtime.device=cpu", "model.dtype=float32", "model.tiny_hidden_size=32"))
    tokenizer = load_tokenizer(cfg.model)
    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    flat = flat_weights(load_model(cfg.model, vocab, cfg.seed))
    params = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.95, seed=3)
    g = torch.Generator().manual_seed(2)
    work = [
        (f"p{i}", torch.randint(3, vocab, (4 + i,), generator=g).tolist(), [0, 1, 2], None) for i in range(4)
    ]

    def run_on(device: str) -> dict:
        fn = decode_function(cfg, vocab, eos, device, flat)
        fn.assign(work, None, params, 5, [])
        return finish(fn)

    reference = run_on("cpu")
    assert len(reference) == 12 and len({tuple(t) for t in reference.values()}) == 12
    assert run_on(target) == reference
    source, dest = (decode_function(cfg, vocab, eos, d, flat) for d in ("cpu", target))
    source.assign(work, None, params, 5, [])
    for _ in range(6):
        source.engine.step()
    keys = [(uid, s) for uid, _, samples, _ in work[:2] for s in samples]
    moved, _ = source.cut([keys], with_kv=True)
    assert any(s.kv is not None and s.generated_ids for s in moved)  # running ones carry their KV
    dest.resume(moved, params, 5)
    migrated = finish(source)
    migrated |= finish(dest)
    assert migrated == reference


DRIVER, OTHER = "ab" * 28, "cd" * 28  # node ids as Ray spells them


class FakeRemote:
    """Stands in for `ray.remote`: records the options and arguments a function is created with."""

    made: list[tuple[str, dict, tuple]] = []

    def __init__(self, cls) -> None:
        self.cls, self.opts = cls, {}

    def options(self, **opts):
        self.opts = opts
        return self

    def remote(self, *args, **kwargs):
        FakeRemote.made.append((self.cls.__name__, self.opts, args))


def test_on_a_gpu_run_colocated_functions_use_the_learners_gpu_and_others_ask_ray_for_theirs(monkeypatch):
    from rlhfless.runtime import lifecycle

    monkeypatch.setattr(lifecycle.ray, "remote", FakeRemote)
    monkeypatch.setattr(lifecycle, "resolve_device", lambda cfg: cfg)  # this machine has no GPU
    cfg = resolve_device(tiny("runtime.executor=ray", "algorithm.kl_coef=0.1"), cuda_available=True)
    tokenizer = load_tokenizer(cfg.model)
    functions = lifecycle.Functions(cfg, tokenizer, True, True, DRIVER, learner_device="cuda:3")
    FakeRemote.made.clear()
    for shape in (
        ("decode", True, DRIVER),
        ("decode", False, OTHER),
        ("prepare", True, DRIVER),
    ):
        functions._create(shape)
    (_, colocated, args_c), (_, own, args_o), (_, prepare, args_p) = FakeRemote.made
    assert (colocated["num_gpus"], args_c[-1]) == (0, "cuda:3")  # the learner's slot, held by the driver
    assert (own["num_gpus"], args_o[-1]) == (cfg.scheduler.gpus_per_actor, "cuda")  # the GPU Ray gives it
    assert (prepare["num_gpus"], args_p[-1]) == (0, "cuda:3")


@pytest.mark.parametrize("device,offered", [("cuda", 3), ("auto", 3), ("cpu", 0)])
def test_an_embedded_ray_offers_every_gpu_but_the_learners(monkeypatch, device, offered):
    from rlhfless.runtime import ray_cluster

    calls = []
    monkeypatch.setattr(ray_cluster.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_cluster.ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert ray_cluster.start_ray(tiny(f"runtime.device={device}").runtime)
    assert calls[0]["num_gpus"] == offered


@pytest.mark.parametrize(
    "asked,device,used", [(True, "cuda:1", True), (True, "cpu", False), (False, "cuda", False)]
)
def test_cuda_graphs_are_asked_for_and_used_on_a_cuda_device_only(asked, device, used):
    assert cuda_graphs(tiny(f"generation.cuda_graphs={str(asked).lower()}"), device) is used


def test_cuda_graphs_are_on_by_default():
    """Measured on an H200 (docs/MEASUREMENTS.md): the same samples, generation 2.4x faster."""
    assert cuda_graphs(tiny(), "cuda") and not cuda_graphs(tiny(), "cpu")
