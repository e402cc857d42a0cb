"""Simulator config sections: cluster, model, workload, training; the planner's `scheduler.` as is."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from rlhfless.checks import check
from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.hardware import GpuSpec, ModelShape, decode_sizes
from rlhfless.planner.placement import ClusterSpec
from rlhfless.planner.pricing import PRICE_SHEETS, Pricing
from rlhfless.typed import typed

ALGORITHMS = ("grpo", "ppo")


@dataclass
class ClusterConfig:
    """The modelled cluster: nodes of identical GPUs, links, price, function start-up."""

    nodes: int = field(default=2, metadata={"help": "nodes in the cluster"})
    gpus_per_node: int = field(default=8, metadata={"help": "GPUs per node"})
    gpu: str = field(
        default="l40s", metadata={"help": "h100, h200, a100, l40s, or a JSON file holding a GpuSpec dict"}
    )
    intra_node_gbps: float = field(
        default=0.0, metadata={"help": "GPU-GPU bandwidth inside a node, GB/s; 0 = the GPU's link"}
    )
    inter_node_gbps: float = field(
        default=0.0, metadata={"help": "bandwidth between nodes, GB/s; 0 = the GPU spec's figure"}
    )
    price_per_gpu_hour: float = field(
        default=0.0, metadata={"help": "USD per GPU-hour; 0 = the price sheet's, else the GPU spec's"}
    )
    price_sheet: str = field(
        default="",
        metadata={
            "help": f"a published price sheet for this GPU ({', '.join(PRICE_SHEETS)}): its price and "
            "billing rules (cold start, keep-alive) replace the scheduler's; empty = none"
        },
    )
    cold_start_s: float = field(
        default=2.0,
        metadata={
            "help": "seconds from requesting a serverless function to its container running: what "
            "a GPU released before the learner takes it back pays to restart (decode functions take "
            "their GPUs from the learner, already running)"
        },
    )

    def __post_init__(self) -> None:
        check(self.nodes >= 1, "nodes", self.nodes, "an integer >= 1")
        check(self.gpus_per_node >= 1, "gpus_per_node", self.gpus_per_node, "an integer >= 1")
        for name in ("intra_node_gbps", "inter_node_gbps", "price_per_gpu_hour", "cold_start_s"):
            check(getattr(self, name) >= 0, name, getattr(self, name), "a number >= 0")
        self.spec  # noqa: B018 - validates the GPU name now rather than mid-run
        if self.price_sheet:
            self.sheet_pricing()  # validates the sheet and its price for this GPU now

    def sheet_pricing(self) -> Pricing:
        try:
            return Pricing.from_sheet(self.price_sheet, self.spec.name)
        except ValueError as err:
            raise ValueError(str(err)) from None

    def pricing(self, scheduler: SchedulerConfig) -> Pricing:
        """The one pricing model for this cluster: the sheet's, else `scheduler`'s rules at `price`."""
        if self.price_sheet and not self.price_per_gpu_hour:
            return self.sheet_pricing()
        base = scheduler.pricing
        return Pricing(self.price, base.bill_cold_start, base.bill_keep_alive)

    @property
    def spec(self) -> GpuSpec:
        is_file = self.gpu.endswith(".json") and Path(self.gpu).is_file()
        return GpuSpec.resolve(json.loads(Path(self.gpu).read_text()) if is_file else self.gpu)

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def price(self) -> float:
        if self.price_per_gpu_hour or not self.price_sheet:
            return self.price_per_gpu_hour or self.spec.price_per_hour
        return self.sheet_pricing().unit_hour

    def bandwidths(self) -> tuple[float, float]:
        """(intra-node, inter-node) bytes/s."""
        spec = self.spec
        return (self.intra_node_gbps or spec.link_gbps) * 1e9, (
            self.inter_node_gbps or spec.inter_node_gbps
        ) * 1e9

    def planner_spec(self, model: ModelShape) -> ClusterSpec:
        intra, inter = self.bandwidths()
        return ClusterSpec(
            self.nodes, self.gpus_per_node, intra, inter, model.weight_bytes, model.kv_bytes_per_token
        )


@dataclass
class SimModelConfig:
    """The policy model and how its actors are timed."""

    name: str = field(
        default="qwen2.5-3b",
        metadata={
            "help": "qwen2.5-3b, qwen2.5-7b, llama-2-7b, llama-2-70b, smollm2-135m, or a config.json path"
        },
    )
    tp: int = field(
        default=1, metadata={"help": "tensor-parallel GPUs per actor (decode, prefill, learner shard)"}
    )
    decode_tp: list[int] = field(
        default_factory=list,
        metadata={
            "help": "tensor-parallel sizes rlhfless's decode actors may take; the planner chooses one "
            "each step with the number of actors, or splits a step between two "
            "(scheduler.split_sizes); verl and rlhfuse keep model.tp. Empty = model.tp "
            "and every smaller power of two whose GPUs keep as much memory for KV as for weights "
            "(roofline only: a measured profile times model.tp alone)"
        },
    )
    profile: str = field(
        default="", metadata={"help": "measured profile JSON (rlhfless profile --output); empty = roofline"}
    )
    max_batch: int = field(
        default=1024,
        metadata={
            "help": "most sequences one decode actor runs at once (vLLM max_num_seqs; verl sets 1024); "
            "0 = only KV memory limits it"
        },
    )

    def __post_init__(self) -> None:
        check(self.tp >= 1, "tp", self.tp, "an integer >= 1")
        check(self.max_batch >= 0, "max_batch", self.max_batch, "an integer >= 0")
        check(all(tp >= 1 for tp in self.decode_tp), "decode_tp", self.decode_tp, "integers >= 1")
        check(
            not (self.profile and set(self.decode_tp) - {self.tp}),
            "decode_tp",
            self.decode_tp,
            f"only model.tp ({self.tp}) with a measured model.profile (other sizes are untimed)",
        )
        self.shape  # noqa: B018 - validates the name now

    @property
    def shape(self) -> ModelShape:
        return ModelShape.resolve(self.name, key="name")


@dataclass
class WorkloadConfig:
    """Prompts and true response lengths: a synthetic dataset shape or a recorded run."""

    dataset: str = field(default="gsm8k", metadata={"help": "synthetic shape: gsm8k, gpqa or lcb"})
    trace: str = field(default="", metadata={"help": "run directory whose rollouts/*.jsonl are replayed"})
    prompts_per_step: int = field(default=256, metadata={"help": "prompts per training step"})
    samples: int = field(default=4, metadata={"help": "responses per prompt (GRPO group size; 1 for PPO)"})
    max_response: int = field(default=2048, metadata={"help": "response length cap, tokens"})
    max_prompt: int = field(default=1024, metadata={"help": "prompt length cap, tokens"})
    dataset_size: int = field(
        default=0, metadata={"help": "prompts in the dataset; 0 = 4 x prompts_per_step"}
    )
    seed: int = field(default=0, metadata={"help": "synthetic lengths seed"})

    def __post_init__(self) -> None:
        from rlhfless.sim.workload import DATASETS

        check(self.dataset in DATASETS, "dataset", self.dataset, f"one of {', '.join(DATASETS)}")
        for name in ("prompts_per_step", "samples", "max_response", "max_prompt"):
            check(getattr(self, name) >= 1, name, getattr(self, name), "an integer >= 1")
        check(self.dataset_size >= 0, "dataset_size", self.dataset_size, "an integer >= 0")


@dataclass
class TrainingConfig:
    """What happens around generation, and how long the simulation runs."""

    algorithm: str = field(default="grpo", metadata={"help": "grpo or ppo (adds a critic)"})
    steps: int = field(default=20, metadata={"help": "training steps simulated per policy"})
    learner_mfu: float = field(default=0.45, metadata={"help": "achieved/peak FLOP/s of the training engine"})
    inference_mfu: float = field(
        default=0.6, metadata={"help": "achieved/peak FLOP/s of reference/critic forward"}
    )
    sweep_steps: int = field(default=8, metadata={"help": "steps per point of each sensitivity sweep"})

    def __post_init__(self) -> None:
        check(self.algorithm in ALGORITHMS, "algorithm", self.algorithm, "grpo or ppo")
        check(self.steps >= 1, "steps", self.steps, "an integer >= 1")
        check(self.sweep_steps >= 1, "sweep_steps", self.sweep_steps, "an integer >= 1")
        for name in ("learner_mfu", "inference_mfu"):
            check(0 < getattr(self, name) <= 1, name, getattr(self, name), "a number in (0, 1]")


@dataclass
class SimConfig:
    """One simulated scenario."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig, metadata={"help": "the cluster"})
    model: SimModelConfig = field(default_factory=SimModelConfig, metadata={"help": "the policy model"})
    workload: WorkloadConfig = field(default_factory=WorkloadConfig, metadata={"help": "prompts and lengths"})
    training: TrainingConfig = field(default_factory=TrainingConfig, metadata={"help": "stages and steps"})
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig, metadata={"help": "the planner"})

    def __post_init__(self) -> None:
        check(
            not (self.scheduler.predictor == "expected" and self.workload.trace),
            "scheduler.predictor",
            "expected",
            "ewma, oracle or noisy with workload.trace (a trace holds samples, not their distribution)",
        )
        per_actor = self.model.tp
        check(
            self.cluster.gpus_per_node % per_actor == 0,
            "model.tp",
            per_actor,
            f"a divisor of cluster.gpus_per_node ({self.cluster.gpus_per_node})",
        )
        for tp in self.model.decode_tp:
            check(
                self.cluster.gpus_per_node % tp == 0,
                "model.decode_tp",
                self.model.decode_tp,
                f"divisors of cluster.gpus_per_node ({self.cluster.gpus_per_node})",
            )

    def decode_sizes(self) -> list[int]:
        """The decode actor sizes rlhfless plans among (`model.decode_tp`, or its default)."""
        if self.model.decode_tp:
            return sorted(set(self.model.decode_tp))
        if self.model.profile:
            return [self.model.tp]
        return decode_sizes(self.model.shape, self.cluster.spec, self.model.tp)


def build(tree: dict[str, Any]) -> SimConfig:
    """A SimConfig from nested dicts; an unknown key or a value of the wrong type is an error
    that names the key."""
    check(isinstance(tree, dict), "config", tree, "a mapping of sections")
    sections = {f.name: f.type for f in fields(SimConfig)}
    classes = {
        "cluster": ClusterConfig,
        "model": SimModelConfig,
        "workload": WorkloadConfig,
        "training": TrainingConfig,
        "scheduler": SchedulerConfig,
    }
    unknown = set(tree) - set(sections)
    check(not unknown, "config", sorted(unknown), f"sections among {sorted(sections)}")
    for name, cls in classes.items():
        values = tree.get(name) or {}
        check(isinstance(values, dict), name, values, "a section (mapping of keys)")
        known = {f.name for f in fields(cls)}
        bad = set(values) - known
        check(not bad, name, sorted(bad), f"keys among {sorted(known)}")
    return typed(SimConfig, {name: tree.get(name) or {} for name in classes})


def to_dict(cfg: Any) -> Any:
    if is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in fields(cfg)}
    return cfg


def set_dotted(tree: dict[str, Any], item: str) -> None:
    """Apply one `section.key=value` override (value parsed as JSON when it can be)."""
    key, sep, raw = item.partition("=")
    parts = key.split(".")
    check(bool(sep) and len(parts) == 2, "override", item, "section.key=value")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    tree.setdefault(parts[0], {})[parts[1]] = value
