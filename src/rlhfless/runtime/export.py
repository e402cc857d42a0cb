"""A training checkpoint as a Hugging Face model directory.

Checkpoints hold bare weights (resuming needs nothing more); transformers, vLLM and a new run's
`model.path=` need a model directory: `config.json`, safetensors weights and the tokenizer.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from safetensors.torch import load_model as load_weights

from rlhfless.config import load_config
from rlhfless.files import shareable
from rlhfless.inputs import check_writable, read_text
from rlhfless.models import load_model, load_tokenizer
from rlhfless.runtime.checkpoint import check_weights, list_checkpoints


class ExportError(ValueError):
    """A source that is not a checkpoint, or a target that is already there."""


def _locate(source: Path) -> tuple[Path, Path]:
    """(checkpoint, run directory) for a run directory (its newest checkpoint) or one checkpoint."""
    if (source / "trainer_state.json").exists():
        checkpoint, run = source, source.parent.parent
    else:
        found = list_checkpoints(source / "checkpoints")
        if not found:
            raise ExportError(
                f"{source}: expected a run directory with checkpoints/step_N/ or one checkpoints/step_N "
                "directory (with trainer_state.json)"
            )
        checkpoint, run = found[-1], source
    if not (run / "config.yaml").exists():
        raise ExportError(
            f"{run / 'config.yaml'}: not found; the checkpoint's run directory needs its config"
        )
    return checkpoint, run


def export_checkpoint(source: Path, target: Path) -> Path:
    """Write the policy of `source` with its tokenizer to the new directory `target`, atomically.

    Returns the checkpoint that was exported.
    """
    if target.exists():
        raise ExportError(f"{target}: already exists; expected a new directory")
    check_writable(target, "OUT_DIR")
    checkpoint, run = _locate(source)
    read_text(run / "config.yaml", "the run's config (written by the run)")  # named before YAML reads it
    cfg = load_config(path=str(run / "config.yaml"))
    tokenizer = load_tokenizer(cfg.model)
    model = load_model(cfg.model, len(tokenizer), cfg.seed)
    check_weights(checkpoint / "model.safetensors", model)  # another model's weights: one line
    load_weights(model, str(checkpoint / "model.safetensors"))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(shareable(tmp), target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return checkpoint
