"""The run's device, chosen once: `runtime.device` (auto, cpu, cuda) resolved when the run starts,
the parameter dtype (`model.dtype=auto`: float32 on every device, so that rollouts keep their
samples whatever the schedule), and the dtype the learner's matmuls run in (`model.compute_dtype`:
bfloat16 autocast on a GPU).

The resolved config is what the run records (config.yaml) and hands to every function, so the
policy, the reference, the critic, the prefill and decode engines and their KV all live on one
device kind. torch is imported only when a run resolves its device.
"""

from __future__ import annotations

from dataclasses import replace

from rlhfless.config import Config, ConfigError


def param_dtype(name: str) -> str:
    """The parameter dtype `model.dtype=name` means: `auto` is float32 on every device. The
    weights are also the rollout engines': in bfloat16 a sequence's tokens move with its batch's
    shape (8 of 16 sequences alike, one batch against each prompt alone, `bench_precision.py`;
    52 of 128 between verl and rlhfless), so a schedule would change samples. The learner still
    computes in bfloat16 on a GPU (`compute_dtype`), over these float32 master weights."""
    return "float32" if name == "auto" else name


def native_bfloat16() -> bool:
    """Whether this machine's CPU multiplies bfloat16 in hardware (AMX tiles or AVX512-BF16):
    there a bfloat16 matmul runs about twice as fast as a float32 one; elsewhere it is emulated."""
    import torch

    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def compute_dtype(name: str, device: str, params: str, native: bool) -> str:
    """The learner's matmul dtype `model.compute_dtype=name` means on `device` with `params`
    weights: `auto` is bfloat16 on CUDA or where the CPU computes it `native`ly; never finer than
    the weights."""
    if params == "bfloat16":
        return "bfloat16"
    if name != "auto":
        return name
    return "bfloat16" if device.startswith("cuda") or native else "float32"


def resolve_device(cfg: Config, cuda_available: bool | None = None) -> Config:
    """`cfg` with `runtime.device` and `model.dtype` concrete; `cuda` where torch sees no GPU is a
    one-line `ConfigError`. `cuda_available` defaults to `torch.cuda.is_available()`."""
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    asked = cfg.runtime.device
    if asked == "cuda" and not cuda_available:
        raise ConfigError(
            "config error: runtime.device: got 'cuda', expected 'auto' or 'cpu' on this machine "
            "(torch sees no CUDA device)"
        )
    device = "cuda" if asked == "cuda" or (asked == "auto" and cuda_available) else "cpu"
    dtype = param_dtype(cfg.model.dtype)
    native = cfg.model.compute_dtype == "auto" and device == "cpu" and native_bfloat16()
    compute = compute_dtype(cfg.model.compute_dtype, device, dtype, native)
    model = replace(cfg.model, dtype=dtype, compute_dtype=compute)
    return replace(cfg, runtime=replace(cfg.runtime, device=device), model=model)


def learner_device(device: str) -> str:
    """Where the learner's slot puts its models on the driver's node: the CPU, or its last GPU. An
    embedded Ray offers the other GPUs to functions, numbered from 0 (`ray_cluster.start_ray`), so
    the two never share one; on an existing cluster, start the driver's node with one GPU fewer."""
    if device != "cuda":
        return "cpu"
    import torch

    return f"cuda:{torch.cuda.device_count() - 1}"
