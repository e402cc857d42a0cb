"""The paper's two evaluation set-ups as simulator presets, with the paper's headline figures."""

from __future__ import annotations

import copy
import itertools
from typing import Any

# What the paper reports (section 7), printed beside what we simulate.
PAPER = {
    "paper-physical": {"label": "best case", "speedup": 1.35, "cost_reduction": 0.448},
    "paper-sim": {"label": "average", "speedup": 1.23, "cost_reduction": 0.387},
}

_PHYSICAL_BASE: dict[str, Any] = {
    "cluster": {"nodes": 2, "gpus_per_node": 8, "gpu": "l40s"},
    "model": {"name": "qwen2.5-3b", "tp": 1},
    "workload": {"dataset": "gsm8k", "prompts_per_step": 512, "samples": 4, "max_response": 2048},
    "training": {"algorithm": "grpo", "steps": 12, "sweep_steps": 6},
}
_SIM_BASE: dict[str, Any] = {
    "cluster": {"nodes": 20, "gpus_per_node": 8, "gpu": "h100"},
    "model": {"name": "llama-2-70b", "tp": 8},
    "workload": {"dataset": "gsm8k", "prompts_per_step": 8192, "samples": 4, "max_response": 2048},
    "training": {"algorithm": "grpo", "steps": 10, "sweep_steps": 3},
}


def _scenario(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    tree = copy.deepcopy(base)
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        tree.setdefault(section, {})[key] = value
    return tree


def preset(name: str) -> list[tuple[str, dict[str, Any]]]:
    """(scenario name, config tree) pairs; the first scenario is the one swept and ablated."""
    if name == "paper-physical":
        grid = itertools.product(("grpo", "ppo"), ("qwen2.5-3b", "qwen2.5-7b"), ("gsm8k", "gpqa", "lcb"))
        return [
            (
                f"{alg}-{model}-{data}",
                _scenario(_PHYSICAL_BASE, training__algorithm=alg, model__name=model, workload__dataset=data),
            )
            for alg, model, data in grid
        ]
    if name == "paper-sim":
        return [
            (f"grpo-llama-2-70b-{d}", _scenario(_SIM_BASE, workload__dataset=d))
            for d in ("gsm8k", "gpqa", "lcb")
        ]
    raise ValueError(f"preset: got {name!r}, expected one of {', '.join(PAPER)}")
