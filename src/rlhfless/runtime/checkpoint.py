"""Checkpoints that a kill can never leave half-written, and that can never run code when read.

A checkpoint is a temporary folder, then one rename. Everything in it loads without unpickling
objects: weights as safetensors, RNG states as JSON, optimizer state through
`torch.load(weights_only=True)` (tensors, numbers, strings and containers only). A damaged,
foreign or malicious checkpoint is refused with a `CheckpointError` naming the file.
"""

from __future__ import annotations

import json
import pickle
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model, save_model

from rlhfless.files import shareable
from rlhfless.inputs import InputError, first_line, read_json, read_text

PREFIX = "step_"
# Settings a resumed run must share with the run that wrote the checkpoint: they fix the weights'
# shapes, the optimizer's and critic's state, the prompt set and the predictor's history layout.
RESUME_KEYS = (
    "seed",
    "model.path",
    "model.gguf_file",
    "model.dtype",
    "model.tiny_hidden_size",
    "model.tiny_layers",
    "algorithm.name",
    "data.source",
    "data.path",
    "data.format",
    "data.size",
    "data.tasks",
    "data.task_config",
    "data.dataset_seed",
    "scheduler.ewma_window",
)


class CheckpointError(InputError):
    """A checkpoint that is damaged, unsafe, or from another model or config; names the file."""


def _rng_state() -> dict[str, Any]:
    """Every RNG as JSON-able lists of ints and floats (no pickled objects)."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": {"version": version, "state": list(internal), "gauss_next": gauss},
        "numpy": {
            "name": name,
            "keys": keys.tolist(),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state().tolist(),
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    py, npy = state["python"], state["numpy"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss_next"]))
    keys = np.array(npy["keys"], dtype=np.uint32)
    np.random.set_state((npy["name"], keys, npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


def save_checkpoint(
    root: Path,
    step: int,
    model: torch.nn.Module,
    trainer_state: dict,
    save_learner_state: Callable[[Path], None],
    keep: int,
    on_file: Callable[[str], None] = lambda name: None,
) -> Path:
    """Write `root/step_NNNNNN/` atomically and prune all but the `keep` newest checkpoints.

    `on_file(name)` runs after each file is written, before the rename: where an injected fault
    (`checkpoint_exit`) kills the writer half-way, as a kill -9 could. A writer killed so leaves
    only a dot-folder, removed by the next write."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f".{PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"{PREFIX}{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    save_model(model, str(tmp / "model.safetensors"))
    on_file("model.safetensors")
    save_learner_state(tmp / "optimizer.pt")  # where the learner lives (`Executor.save_state`)
    on_file("optimizer.pt")
    (tmp / "rng.json").write_text(json.dumps(_rng_state()))
    on_file("rng.json")
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **trainer_state}, indent=1))
    on_file("trainer_state.json")
    if final.exists():
        shutil.rmtree(final)
    shareable(tmp).rename(final)
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary folders start with a dot and are ignored)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob(f"{PREFIX}*") if (p / "trainer_state.json").exists())


def check_weights(path: Path, model: torch.nn.Module) -> None:
    """Refuse a weights file whose tensors are not exactly `model`'s (another model or size)."""
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    try:
        with safe_open(str(path), framework="pt") as handle:
            found = {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}
    except (SafetensorError, OSError) as err:
        raise CheckpointError(
            f"{path}: not a readable safetensors file ({err}), expected model weights"
        ) from None
    for name, shape in found.items():
        if name in expected and expected[name] != shape:
            raise CheckpointError(
                f"{path}: tensor {name!r} has shape {list(shape)}, expected {list(expected[name])} "
                "(a checkpoint of another model or size?)"
            )
    for name, shape in expected.items():
        # Tied weights (lm_head = embed_tokens) are stored once, under one of their names.
        if name not in found and shape not in found.values():
            raise CheckpointError(f"{path}: tensor {name!r} missing, expected the configured model's weights")
    extra = sorted(set(found) - set(expected))
    if extra:
        raise CheckpointError(
            f"{path}: unexpected tensor {extra[0]!r}, expected the configured model's weights"
        )


def load_learner_state(path: Path, mmap: bool = False) -> dict:
    """Optimizer (and critic) state, loaded with `weights_only=True`: a pickle that would build any
    object other than tensors and plain containers is refused, never executed. `mmap`: tensors
    stay mapped from the file, unread (a check that holds no copy of them)."""
    if not path.is_file():
        raise CheckpointError(f"{path}: not found, expected the optimizer state of the checkpoint")
    try:
        state = torch.load(path, weights_only=True, map_location="cpu", mmap=mmap)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as err:
        raise CheckpointError(
            f"{path}: refused ({first_line(err)[:160]}), expected tensors and plain containers only"
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: got {type(state).__name__}, expected a state mapping")
    version = state.get("version")
    if (
        isinstance(version, bool)
        or not isinstance(version, int)
        or not isinstance(state.get("learner"), dict)
    ):
        raise CheckpointError(
            f"{path}: keys 'learner' and 'version': got {sorted(map(str, state))!r:.80}, expected the learner's "
            "state mapping and an integer weight version"
        )
    return state


def read_trainer_state(path: Path) -> dict:
    """`trainer_state.json` with the keys a resume reads, checked before anything is restored."""
    state = read_json(path, "the checkpoint's trainer state")
    step = state.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"{path}: key 'step': got {step!r}, expected an integer >= 0")
    for key in ("loader", "predictor"):
        if not isinstance(state.get(key), dict):
            raise CheckpointError(f"{path}: key {key!r}: got {state.get(key)!r:.40}, expected a mapping")
    held_out = state.get("validation", {"lengths": {}})  # validation on functions
    if not isinstance(held_out, dict) or not isinstance(held_out.get("lengths"), dict):
        raise CheckpointError(
            f"{path}: key 'validation': got {held_out!r:.40}, expected a mapping with the held-out lengths"
        )
    return state


def _read_rng(path: Path) -> dict:
    state = read_json(path, "the checkpoint's RNG states")
    for key in ("python", "numpy", "torch"):
        if key not in state:
            raise CheckpointError(f"{path}: key {key!r} missing, expected python, numpy and torch states")
    return state


def load_checkpoint(path: Path, model: torch.nn.Module) -> dict:
    """Restore weights and RNG states in place; return the trainer's state. The learner's state,
    `path / "optimizer.pt"`, is checked here but loaded by the process that holds the learner
    (`Executor.load_state`), so its optimizer states never pass through this one.

    Every file is read and checked before anything is restored, so a refused checkpoint leaves the
    model and the RNGs as they were.
    """
    try:
        trainer_state = read_trainer_state(path / "trainer_state.json")
        rng = _read_rng(path / "rng.json")
    except InputError as err:
        raise CheckpointError(str(err)) from None
    check_weights(path / "model.safetensors", model)
    load_learner_state(path / "optimizer.pt", mmap=True)
    try:
        _set_rng_state(rng)
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(
            f"{path / 'rng.json'}: malformed RNG state ({err}), expected this version's layout"
        ) from None
    load_model(model, str(path / "model.safetensors"))
    return trainer_state


def _dotted(tree: dict, key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def resumes(resume: bool | str, checkpoints: list[Path]) -> bool:
    """Whether a run of `resume` (true, false or auto) continues one of its directory's
    `checkpoints` (`list_checkpoints`): auto continues one where there is one."""
    return resume is True or (resume == "auto" and bool(checkpoints))


def check_resume(run_dir: Path, config: dict) -> None:
    """Refuse to resume `run_dir` with a config that differs in a `RESUME_KEYS` setting.

    `config` is the new run's config as a dict (`to_dict(cfg)`); the run's own is its config.yaml.
    """
    import yaml

    path = run_dir / "config.yaml"
    try:
        saved = yaml.safe_load(read_text(path, "the run's config (written by the run)"))
    except InputError as err:
        raise CheckpointError(str(err)) from None
    except yaml.YAMLError as err:
        raise CheckpointError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(saved, dict):
        raise CheckpointError(f"{path}: got {type(saved).__name__}, expected a mapping of sections")
    for key in RESUME_KEYS:
        old, new = _dotted(saved, key), _dotted(config, key)
        if old != new:
            raise CheckpointError(
                f"{path}: {key}: the checkpoint's run has {old!r}, this config {new!r}; expected the "
                "same value to resume (use a new output_dir to start over)"
            )
