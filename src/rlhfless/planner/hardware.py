"""GPU specs, model shapes and the roofline that turns them into a planner `Profile`.

The planner needs decode-step and prefill times for any (batch, context) and any number of
prompt tokens. When no measured table exists (a cluster we do not have, a model we cannot
load) they are derived here: each kernel group costs the smooth maximum of its compute time
and its memory time, each divided by an efficiency factor fitted to the Vidur H100 profiles
quoted in `shared/data/hardware_facts.md`; the LM head, the tensor-parallel all-reduces and a
fixed per-step overhead (scheduler, sampling, launches), which those profiles omit, are added.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from rlhfless.planner.profile import Profile

# Batch sizes and lengths of the derived table: powers of two up to 1024 (the issue asks for 1..256;
# engines run up to vLLM's max_num_seqs, 1024 as verl sets it, and extrapolating a roofline from its
# 128-256 segment under-states large batches by 10-20%); context and tokens from 1 to 8192 in steps
# of 256.
TABLE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TABLE_LENGTHS = (1, *range(256, 8192 + 1, 256))


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator type: peak numbers, links and price."""

    name: str
    bf16_tflops: float  # dense BF16 peak
    memory_gb: float
    memory_tbps: float  # HBM/GDDR bandwidth, TB/s
    link_gbps: float  # effective one-way GPU-GPU bandwidth inside a node, GB/s
    inter_node_gbps: float  # effective bandwidth between nodes per GPU pair, GB/s
    price_per_hour: float  # USD per GPU-hour
    link_latency_us: float = 10.0  # per collective call
    compute_efficiency: float = 0.6  # achieved / peak FLOP/s on dense GEMMs
    memory_efficiency: float = 0.65  # achieved / peak bandwidth on weight and KV reads

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "name" and not (isinstance(value, int | float) and value > 0):
                raise ValueError(f"{f.name}: got {value!r}, expected a positive number")
        for name in ("compute_efficiency", "memory_efficiency"):
            if getattr(self, name) > 1:
                raise ValueError(f"{name}: got {getattr(self, name)}, expected a value in (0, 1]")

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> GpuSpec:
        """A GPU not built in, e.g. `{"name": "b200", "bf16_tflops": 2250, ...}`."""
        known = {f.name for f in fields(cls)}
        unknown = set(spec) - known
        if unknown:
            raise ValueError(
                f"gpu spec: got unknown keys {sorted(unknown)}, expected some of {sorted(known)}"
            )
        return cls(**spec)

    @classmethod
    def resolve(cls, gpu: str | dict[str, Any] | GpuSpec) -> GpuSpec:
        """A built-in name, a spec dict, or a spec."""
        if isinstance(gpu, GpuSpec):
            return gpu
        if isinstance(gpu, dict):
            return cls.from_dict(gpu)
        key = gpu.lower()
        if key not in BUILTIN_GPUS:
            raise ValueError(f"gpu: got {gpu!r}, expected one of {sorted(BUILTIN_GPUS)} or a spec dict")
        return BUILTIN_GPUS[key]


# Sources: hardware_facts.md. H100 link: NCCL all-reduce TP8 of 64 MiB in 0.322 ms is a bus
# bandwidth of ~365 GB/s; across nodes ~36 GB/s. Other links scale the H100's measured/nominal
# ratio (0.42) to their nominal figure; inter-node figures for A100/L40S and the H200 price are
# assumptions (not in the facts file), marked so.
BUILTIN_GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec("h100", 989.4, 80, 3.35, 365.0, 36.0, 3.95),
    "h200": GpuSpec("h200", 989.0, 141, 4.8, 365.0, 36.0, 4.54),  # price: assumption
    "a100": GpuSpec("a100", 312.0, 80, 2.04, 250.0, 25.0, 2.50),  # inter-node: assumption
    # PCIe Gen4 x16: 32 GB/s one way nominal, ~25 effective; no NVLink, slower collectives.
    "l40s": GpuSpec("l40s", 362.0, 48, 0.864, 25.0, 25.0, 1.95, link_latency_us=25.0),
}


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer that set its compute and memory costs."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied_embeddings: bool = False
    head_dim: int = 0  # 0: hidden // heads
    dtype_bytes: int = 2
    mlp_matrices: int = 3  # a gated MLP's gate, up and down (Llama, Qwen, Mistral, Gemma); 2 ungated

    def __post_init__(self) -> None:
        for name in (
            "layers",
            "hidden",
            "heads",
            "kv_heads",
            "intermediate",
            "vocab",
            "dtype_bytes",
            "mlp_matrices",
        ):
            value = getattr(self, name)
            if not (isinstance(value, int) and value > 0):
                raise ValueError(f"{name}: got {value!r}, expected a positive integer")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads: got {self.kv_heads}, expected a divisor of heads={self.heads}")
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    @classmethod
    def resolve(cls, model: str | dict[str, Any] | ModelShape, key: str = "model") -> ModelShape:
        """A built-in name, a path to a HF `config.json` (or its folder), a config dict, or a shape;
        an unknown name is refused as the value of `key`."""
        if isinstance(model, ModelShape):
            return model
        if isinstance(model, dict):
            return cls.from_hf_config(model)
        if model.lower() in BUILTIN_MODELS:
            return BUILTIN_MODELS[model.lower()]
        if Path(model).exists():
            return cls.from_hf_config(model)
        raise ValueError(
            f"{key}: got {model!r}, expected one of {sorted(BUILTIN_MODELS)} or a path to a config.json"
        )

    @classmethod
    def from_hf_config(cls, config: str | Path | dict[str, Any]) -> ModelShape:
        """Shape from a Hugging Face `config.json` (path, folder holding it, or the parsed dict)."""
        if not isinstance(config, dict):
            path = Path(config)
            if path.is_dir():
                path = path / "config.json"
            config = json.loads(path.read_text())
        cfg = config.get("text_config", config)  # multimodal configs nest the language model
        try:
            heads = int(cfg["num_attention_heads"])
            return cls(
                name=str(cfg.get("_name_or_path") or cfg.get("model_type") or "hf-model"),
                layers=int(cfg["num_hidden_layers"]),
                hidden=int(cfg["hidden_size"]),
                heads=heads,
                kv_heads=int(cfg.get("num_key_value_heads") or heads),
                intermediate=int(cfg["intermediate_size"]),
                vocab=int(cfg["vocab_size"]),
                tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                head_dim=int(cfg.get("head_dim") or 0),
                mlp_matrices=2 if cfg.get("model_type") in UNGATED_MLP else 3,
            )
        except KeyError as err:
            raise ValueError(
                f"config.json: missing {err.args[0]!r}, expected a decoder-only LM config"
            ) from err

    @property
    def layer_params(self) -> int:
        """Linear weights of all transformer blocks (attention projections + MLP)."""
        q_and_o = 2 * self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        mlp = self.mlp_matrices * self.hidden * self.intermediate
        return self.layers * (q_and_o + kv + mlp)

    @property
    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layer_params + embeddings

    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers, whole model (before tensor-parallel sharding)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def kv_bytes_per_token_per_gpu(self, tp: int) -> int:
        """KV heads are split across TP ranks; with more ranks than KV heads they are replicated."""
        return 2 * self.layers * math.ceil(self.kv_heads / tp) * self.head_dim * self.dtype_bytes


# Model families whose MLP is up and down only (`model_type` in their config.json): the rest
# (Llama, Qwen2, Mistral, Gemma, Phi-3) gate it with a third matrix.
UNGATED_MLP = frozenset(
    {"gpt2", "gpt_neo", "gpt_neox", "gptj", "gpt_bigcode", "phi", "opt", "bloom", "falcon", "starcoder2"}
)

BUILTIN_MODELS: dict[str, ModelShape] = {
    "qwen2.5-3b": ModelShape("qwen2.5-3b", 36, 2048, 16, 2, 11008, 151936, tied_embeddings=True),
    "qwen2.5-7b": ModelShape("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064),
    "llama-2-7b": ModelShape("llama-2-7b", 32, 4096, 32, 32, 11008, 32000),
    "llama-2-70b": ModelShape("llama-2-70b", 80, 8192, 64, 8, 28672, 32000),
    "smollm2-135m": ModelShape("smollm2-135m", 30, 576, 9, 3, 1536, 49152, tied_embeddings=True),
}


@dataclass(frozen=True)
class Roofline:
    """Kernel-group times (ms) of one model on `tp` GPUs of one type."""

    model: ModelShape
    gpu: GpuSpec
    tp: int = 1
    step_overhead_ms: float = 2.0  # scheduler, sampling, launches: per engine step
    per_sequence_overhead_ms: float = 0.01  # sampling and bookkeeping per running sequence
    memory_utilization: float = 0.9  # share of GPU memory the engine may use
    activation_reserve_gb: float = 1.0  # per GPU, kept for activations and workspace

    def __post_init__(self) -> None:
        if not (isinstance(self.tp, int) and self.tp >= 1):
            raise ValueError(f"tp: got {self.tp!r}, expected a positive integer")
        if not 0 < self.memory_utilization <= 1:
            raise ValueError(f"memory_utilization: got {self.memory_utilization}, expected a value in (0, 1]")

    def _kernel_ms(self, flops: float, nbytes: float) -> float:
        """Smooth roofline: sqrt(compute^2 + memory^2) bends through the ridge the way Vidur does."""
        compute = flops / (self.gpu.bf16_tflops * 1e12 * self.gpu.compute_efficiency)
        memory = nbytes / (self.gpu.memory_tbps * 1e12 * self.gpu.memory_efficiency)
        return 1e3 * math.hypot(compute, memory)

    def linear_ms(self, tokens: int) -> float:
        """All transformer-block linear layers for `tokens` tokens (Vidur's non-attention time)."""
        m = self.model
        return self._kernel_ms(
            2.0 * tokens * m.layer_params / self.tp, m.layer_params * m.dtype_bytes / self.tp
        )

    def lm_head_ms(self, sequences: int) -> float:
        """Logits for one token per sequence (vLLM computes prefill logits for the last token only)."""
        m = self.model
        weights = m.vocab * m.hidden
        return self._kernel_ms(2.0 * sequences * weights / self.tp, weights * m.dtype_bytes / self.tp)

    def decode_attention_ms(self, batch: int, context: float) -> float:
        """Reading `batch` KV caches of `context` tokens: memory-bound for decode."""
        m = self.model
        flops = 4.0 * batch * context * m.heads * m.head_dim * m.layers / self.tp
        return self._kernel_ms(flops, batch * context * m.kv_bytes_per_token_per_gpu(self.tp))

    def prefill_attention_ms(self, tokens: int) -> float:
        """Causal self-attention over one prompt of `tokens` tokens: quadratic compute."""
        m = self.model
        flops = 4.0 * (tokens * tokens / 2.0) * m.heads * m.head_dim * m.layers / self.tp
        return self._kernel_ms(flops, tokens * m.kv_bytes_per_token_per_gpu(self.tp))

    def allreduce_ms(self, tokens: int) -> float:
        """Two ring all-reduces of the hidden states per layer under tensor parallelism."""
        if self.tp == 1:
            return 0.0
        m = self.model
        size = tokens * m.hidden * m.dtype_bytes
        one = self.gpu.link_latency_us * 1e-3 + 1e3 * 2 * (self.tp - 1) / self.tp * size / (
            self.gpu.link_gbps * 1e9
        )
        return 2 * m.layers * one

    def decode_ms(self, batch: int, context: float) -> float:
        """One decode step: every running sequence gains one token."""
        return (
            self.linear_ms(batch)
            + self.decode_attention_ms(batch, context)
            + self.lm_head_ms(batch)
            + self.allreduce_ms(batch)
            + self.step_overhead_ms
            + self.per_sequence_overhead_ms * batch
        )

    def prefill_ms(self, tokens: int) -> float:
        """Prefill of one prompt of `tokens` tokens."""
        return (
            self.linear_ms(tokens)
            + self.prefill_attention_ms(tokens)
            + self.lm_head_ms(1)
            + self.allreduce_ms(tokens)
            + self.step_overhead_ms
            + self.per_sequence_overhead_ms
        )

    @property
    def kv_bytes(self) -> float:
        """Bytes a GPU keeps for KV cache once its share of the weights and a reserve are loaded."""
        return (
            self.gpu.memory_gb * 1e9 * self.memory_utilization
            - self.model.weight_bytes / self.tp
            - self.activation_reserve_gb * 1e9
        )

    @property
    def max_kv_tokens(self) -> int:
        """Tokens of KV cache the actor can hold once weights and a reserve are loaded."""
        per_gpu = self.kv_bytes
        if per_gpu <= 0:
            raise ValueError(
                f"tp: got {self.tp}, expected enough GPUs to hold {self.model.name} "
                f"({self.model.weight_bytes / 1e9:.1f} GB) on {self.gpu.name} ({self.gpu.memory_gb} GB each)"
            )
        return int(per_gpu // self.model.kv_bytes_per_token_per_gpu(self.tp))

    def table(self) -> dict[str, Any]:
        """The planner's profile format: decode grid, prefill list, GPUs, KV capacity."""
        return {
            "decode": [
                {"batch": b, "context": c, "ms": round(self.decode_ms(b, c), 4)}
                for b in TABLE_BATCHES
                for c in TABLE_LENGTHS
            ],
            "prefill": [{"tokens": n, "ms": round(self.prefill_ms(n), 4)} for n in TABLE_LENGTHS],
            "gpus": self.tp,
            "max_kv_tokens": self.max_kv_tokens,
        }


def roofline_table(
    model: str | dict[str, Any] | ModelShape, gpu: str | dict[str, Any] | GpuSpec, tp: int = 1, **knobs: Any
) -> dict[str, Any]:
    """Derived profile table as a JSON-ready dict (what `rlhfless profile --simulated` prints),
    its note saying so: a table read back (`plan --profile`) is then not taken for a measured one."""
    roof = Roofline(ModelShape.resolve(model), GpuSpec.resolve(gpu), tp, **knobs)
    return {**roof.table(), "note": _roofline_note(roof)}


def _roofline_note(roof: Roofline) -> str:
    return f"roofline: {roof.model.name} on {roof.tp} x {roof.gpu.name}"


def roofline_profile(
    model: str | dict[str, Any] | ModelShape,
    gpu: str | dict[str, Any] | GpuSpec,
    tp: int = 1,
    cold_start_s: float = 0.0,
    **knobs: Any,
) -> Profile:
    """The planner's `Profile` for one actor of `tp` GPUs, derived instead of measured."""
    roof = Roofline(ModelShape.resolve(model), GpuSpec.resolve(gpu), tp, **knobs)
    profile = Profile.from_dict(roof.table())
    profile.cold_start_s = cold_start_s
    profile.note = _roofline_note(roof)
    return profile


def decode_sizes(
    model: str | dict[str, Any] | ModelShape, gpu: str | dict[str, Any] | GpuSpec, largest: int
) -> list[int]:
    """Tensor-parallel sizes worth planning decode actors at: the powers of two up to `largest`
    (the actor size the user set) whose GPUs keep at least as much memory for KV as for their
    share of the weights. A smaller actor holds fewer sequences but spends fewer GPUs on each
    weight read and all-reduce, so on a throughput-bound step it may decode more tokens per GPU;
    below that memory line its batch is too small to."""
    shape, spec = ModelShape.resolve(model), GpuSpec.resolve(gpu)
    sizes = [1 << k for k in range(largest.bit_length()) if (1 << k) < largest]
    fit = [tp for tp in sizes if Roofline(shape, spec, tp).kv_bytes >= shape.weight_bytes / tp]
    return [*fit, largest]
