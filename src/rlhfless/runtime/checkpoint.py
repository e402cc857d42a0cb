"""Checkpoints that a kill can never leave half-written: a temporary folder, then one rename."""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model

PREFIX = "step_"


def _rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(
    root: Path, step: int, model: torch.nn.Module, trainer_state: dict, learner_state: dict, keep: int
) -> Path:
    """Write `root/step_NNNNNN/` atomically and prune all but the `keep` newest checkpoints."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    save_model(model, str(tmp / "model.safetensors"))
    torch.save(learner_state, tmp / "optimizer.pt")
    torch.save(_rng_state(), tmp / "rng.pt")
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **trainer_state}, indent=1))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary folders start with a dot and are ignored)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob(f"{PREFIX}*") if (p / "trainer_state.json").exists())


def load_checkpoint(path: Path, model: torch.nn.Module) -> tuple[dict, dict]:
    """Restore weights and RNG states in place; return (trainer_state, learner_state)."""
    load_model(model, str(path / "model.safetensors"))
    _set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    learner_state = torch.load(path / "optimizer.pt", weights_only=False)
    return json.loads((path / "trainer_state.json").read_text()), learner_state
