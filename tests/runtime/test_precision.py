"""`model.compute_dtype`: bfloat16 matmuls over float32 master weights in the learner, and the
rollout engines' weights and KV in bfloat16, refreshed after every update."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch

from rlhfless import devices
from rlhfless.config import ConfigError, load_config
from rlhfless.devices import compute_dtype, resolve_device
from rlhfless.models import load_model, load_tokenizer
from rlhfless.runtime.executor import build_learner
from rlhfless.runtime.logprobs import SelectedLogSoftmax
from rlhfless.runtime.precision import deterministic
from rlhfless.runtime.samples import Sample
from rlhfless.runtime.trainer import build_executor


def tiny(*overrides: str):
    return load_config(preset="tiny", overrides=("trainer.progress=false", *overrides))


def batch(vocab: int, n: int = 8) -> tuple[list[Sample], list[torch.Tensor]]:
    rng = np.random.default_rng(0)
    samples = [
        Sample(
            f"p{i // 4}",
            i % 4,
            rng.integers(3, vocab, 9).tolist(),
            rng.integers(3, vocab, 5 + i).tolist(),
            "stop",
        )
        for i in range(n)
    ]
    return samples, [torch.full((len(s.response_ids),), float(rng.normal())) for s in samples]


def test_auto_computes_in_bfloat16_on_a_gpu_or_a_cpu_that_multiplies_it_natively():
    assert compute_dtype("auto", "cuda", "float32", native=False) == "bfloat16"
    assert compute_dtype("auto", "cpu", "float32", native=True) == "bfloat16"
    assert compute_dtype("auto", "cpu", "float32", native=False) == "float32"
    assert compute_dtype("bfloat16", "cpu", "float32", native=False) == "bfloat16"
    assert (
        compute_dtype("float32", "cpu", "bfloat16", native=False) == "bfloat16"
    )  # never finer than the weights


@pytest.mark.parametrize("native, expected", [(True, "bfloat16"), (False, "float32")])
def test_the_run_records_the_compute_dtype_auto_resolved_to(monkeypatch, native, expected):
    monkeypatch.setattr(devices, "native_bfloat16", lambda: native)
    cfg = resolve_device(tiny("model.compute_dtype=auto"), cuda_available=False)
    assert (cfg.model.dtype, cfg.model.compute_dtype) == ("float32", expected)


def test_an_unknown_compute_dtype_is_a_one_line_error_naming_the_key():
    with pytest.raises(ConfigError) as err:
        tiny("model.compute_dtype=float16")
    assert "compute_dtype" in str(err.value) and "\n" not in str(err.value)


def test_the_learner_computes_in_bfloat16_and_keeps_float32_weights_close_to_a_float32_update():
    cfg = resolve_device(tiny())
    tokenizer = load_tokenizer(cfg.model)
    policy = load_model(cfg.model, len(tokenizer), cfg.seed).train()
    samples, advantages = batch(len(tokenizer))
    learners = {}
    for name in ("float32", "bfloat16"):
        model = copy.deepcopy(policy)
        cfg_dtype = load_config(preset="tiny", overrides=(f"model.compute_dtype={name}",))
        learners[name] = build_learner(resolve_device(cfg_dtype), model, tokenizer.pad_token_id)
    logp = {name: torch.cat(lr.logprobs(lr.model, samples)) for name, lr in learners.items()}
    assert not torch.equal(logp["float32"], logp["bfloat16"])  # the matmuls did run in bfloat16
    assert torch.allclose(logp["float32"], logp["bfloat16"], atol=0.05)
    metrics = {name: lr.learn(samples, advantages, None) for name, lr in learners.items()}
    assert metrics["bfloat16"]["grad_norm"] == pytest.approx(metrics["float32"]["grad_norm"], rel=0.05)
    start = torch.nn.utils.parameters_to_vector(policy.parameters())
    steps = {
        name: torch.nn.utils.parameters_to_vector(lr.model.parameters()) - start
        for name, lr in learners.items()
    }
    assert {p.dtype for p in learners["bfloat16"].model.parameters()} == {torch.float32}
    cosine = torch.nn.functional.cosine_similarity(steps["float32"], steps["bfloat16"], dim=0)
    assert cosine > 0.95


def test_the_heads_backward_under_autocast_is_autograds_through_the_same_bfloat16_logits():
    torch.manual_seed(0)
    hidden = torch.randn(6, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    targets = torch.randint(0, 50, (6,))
    grad_out = torch.randn(6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = SelectedLogSoftmax.apply(hidden, weight, None, targets, 0.7)
    ours_grads = torch.autograd.grad(ours, (hidden, weight), grad_out)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = torch.nn.functional.linear(hidden, weight).float() / 0.7
    plain = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]
    plain_grads = torch.autograd.grad(plain, (hidden, weight), grad_out)
    assert torch.allclose(ours, plain, atol=1e-5)
    for a, b in zip(ours_grads, plain_grads, strict=True):
        assert a.dtype == torch.float32
        assert torch.allclose(a, b, rtol=2e-2, atol=2e-2)


def test_rollouts_stay_in_the_weights_dtype_under_a_bfloat16_learner():
    """A bfloat16 engine's tokens would depend on its batch: the prefill and decode engines keep
    the policy's float32 weights, whatever the learner computes in."""
    cfg = resolve_device(tiny("model.compute_dtype=bfloat16"))
    tokenizer = load_tokenizer(cfg.model)
    policy = load_model(cfg.model, len(tokenizer), cfg.seed)
    executor = build_executor(cfg, tokenizer, policy)
    assert executor.engine.model is policy
    assert {p.dtype for p in policy.parameters()} == {torch.float32}
    assert executor.learner.compute_dtype == "bfloat16"


def test_a_gpu_learners_passes_run_deterministic_kernels_and_the_setting_is_restored_after(monkeypatch):
    """Atomic adds (gather's backward) and split attention backwards sum in a racy order on a GPU:
    two runs of one schedule would learn weights a rounding apart and sample differently next
    step. The learner's passes on a GPU run torch's deterministic kernels, strictly (under
    `warn_only` attention's backward stays racy); a CPU's already are, and nothing changes there."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert not torch.are_deterministic_algorithms_enabled()
    with deterministic(torch.device("cpu")):
        assert not torch.are_deterministic_algorithms_enabled()
    with deterministic(torch.device("cuda")):  # flags only: no GPU is touched
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"  # what torch asks of cuBLAS
    assert not torch.are_deterministic_algorithms_enabled()


def test_every_backward_of_the_learner_and_the_critic_runs_under_the_deterministic_kernels(monkeypatch):
    """PPO with a KL loss, the GPU's setting on this CPU: the critic's update and the policy's."""
    from rlhfless.runtime import critic, learner

    modes: list[bool] = []
    real = torch.Tensor.backward

    def backward(self, *args, **kwargs):
        modes.append(torch.are_deterministic_algorithms_enabled())
        return real(self, *args, **kwargs)

    def as_on_a_gpu(device):
        return deterministic(torch.device("cuda"))

    monkeypatch.setattr(torch.Tensor, "backward", backward)
    monkeypatch.setattr(learner, "deterministic", as_on_a_gpu)
    monkeypatch.setattr(critic, "deterministic", as_on_a_gpu)
    cfg = resolve_device(tiny("algorithm.name=ppo", "algorithm.kl_coef=0.1"))
    tokenizer = load_tokenizer(cfg.model)
    executor = build_executor(cfg, tokenizer, load_model(cfg.model, len(tokenizer), cfg.seed))
    samples, _ = batch(len(tokenizer))
    ref = executor.learner.logprobs(executor.reference, samples)
    rewards = [torch.zeros(len(s.response_ids)) for s in samples]
    advantages, _ = executor.critic_update(samples, rewards)
    critic_passes = len(modes)
    executor.learn(samples, advantages, ref)
    assert critic_passes > 0 and len(modes) > critic_passes
    assert all(modes) and not torch.are_deterministic_algorithms_enabled()
