"""Run a preset or config end to end: summary.json, steps.jsonl, figures, and the printed table."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np

from rlhfless.files import write_atomic
from rlhfless.sim import experiments, figures
from rlhfless.sim.config import build, set_dotted, to_dict
from rlhfless.sim.presets import PAPER

MAIN = ("verl", "rlhfless")
FIRST = (*experiments.ABLATION, "rlhfuse")


def configs_of(scenarios: list[tuple[str, dict[str, Any]]], overrides: list[str]) -> list[tuple[str, Any]]:
    """Each scenario's checked config, `overrides` applied to every one."""
    built = []
    for scenario, tree in scenarios:
        tree = copy.deepcopy(tree)
        for item in overrides:
            set_dotted(tree, item)
        built.append((scenario, build(tree)))
    return built


def simulate(
    name: str,
    scenarios: list[tuple[str, dict[str, Any]]],
    overrides: list[str],
    output: Path,
    sweeps: bool = True,
) -> str:
    """Everything the `simulate` command writes; returns the table it prints. Every scenario's
    config is checked before anything is written."""
    built = configs_of(scenarios, overrides)
    output.mkdir(parents=True, exist_ok=True)
    summaries: dict[str, dict[str, dict[str, float]]] = {}
    configs = {}
    rows: list[str] = []
    for index, (scenario, cfg) in enumerate(built):
        configs[scenario] = to_dict(cfg)
        variants = FIRST if index == 0 else MAIN
        results = experiments.compare(cfg, variants, cfg.training.steps)
        for variant, steps in results.items():
            for r in steps:
                rows.append(json.dumps({"scenario": scenario, "variant": variant, **r.row()}) + "\n")
        summaries[scenario] = experiments.summarize(results)
        if index == 0:
            first_cfg = cfg
            figures.ablation_scatter({k: results[k] for k in experiments.ABLATION}, output / "ablation.png")
            figures.bars(
                summaries[scenario],
                ("+assignment", "rlhfuse"),
                output / "assignment_vs_rlhfuse.png",
                "Per-actor cut (RLHFless) vs global cut (RLHFuse)",
            )
    write_atomic(output / "steps.jsonl", "".join(rows))
    swept = _sweeps(first_cfg, output) if sweeps else {}
    headline = _headline(name, summaries)
    summary = {
        "preset": name,
        "scenarios": summaries,
        "headline": headline,
        "paper": PAPER.get(name),
        "sweeps": swept,
        "configs": configs,
    }
    write_atomic(output / "summary.json", json.dumps(summary, indent=1) + "\n")
    return _table(name, summaries, headline)


def _sweeps(cfg: Any, output: Path) -> dict[str, Any]:
    n = cfg.training.sweep_steps
    out = {
        "tau": experiments.sweep(cfg, "rlhfless", "tau", experiments.TAUS, n),
        "lam": experiments.sweep(cfg, "rlhfless", "lam", experiments.LAMS, n),
        "ewma_window": experiments.sweep(cfg, "rlhfless", "ewma_window", experiments.WINDOWS, n),
        "noise": experiments.sweep(cfg, "rlhfless", "noise", experiments.NOISES, n),
        "actors": experiments.actor_sweep(cfg, n),
    }
    nodes = tuple(k for k in experiments.NODES if k <= cfg.cluster.nodes) or (cfg.cluster.nodes,)
    out["scalability"] = experiments.scalability(cfg, n, nodes)
    labels = {
        "tau": "tau (cut threshold)",
        "lam": "lambda (time weight)",
        "ewma_window": "EWMA window",
        "noise": "predictor noise (sigma of log factor)",
        "actors": "decode actors (fixed N)",
    }
    for key, label in labels.items():
        figures.sweep_plot(out[key], label, output / f"sweep_{key}.png", f"{label} sweep")
    figures.scalability_plot(out["scalability"], output / "scalability.png")
    return out


def _headline(name: str, summaries: dict[str, dict[str, dict[str, float]]]) -> dict[str, float | str]:
    """RLHFless vs verl over the scenarios (best case for paper-physical, else the average), for
    the whole step and for the generation phase."""
    pick = max if name == "paper-physical" else lambda xs: float(np.mean(xs))
    keys = (
        "speedup",
        "cost_reduction",
        "generation_speedup",
        "generation_cost_reduction",
        "bound_speedup",
        "bound_cost_reduction",
        "generation_bound_speedup",
        "generation_bound_cost_reduction",
        "generation_over_floor",
        "cost_over_floor",
    )
    out: dict[str, float | str] = {"label": "best case" if name == "paper-physical" else "average"}
    for key in keys:
        values = [s["rlhfless"][key] for s in summaries.values()]
        # the best case of a ratio over the floor is its least
        out[key] = min(values) if name == "paper-physical" and key.endswith("_over_floor") else pick(values)
    return out


def _table(name: str, summaries: dict[str, dict[str, dict[str, float]]], headline: dict[str, Any]) -> str:
    lines = [
        f"{'scenario (simulated)':34s} {'variant':12s} {'tp':>4s} {'step s':>8s} {'cost $':>9s} {'speedup':>8s} "
        f"{'cost -%':>8s} {'gen x':>6s} {'gen $ -%':>9s} {'gen s':>7s} {'/floor':>7s} {'gen $':>7s} "
        f"{'/floor':>7s} {'bound x':>8s} {'bound -%':>9s}"
    ]
    for scenario, rows in summaries.items():
        for variant, row in rows.items():
            lines.append(
                f"{scenario:34s} {variant:12s} {row['mean_actor_gpus']:4.1f} {row['mean_step_time']:8.1f} "
                f"{row['mean_cost']:9.3f} "
                f"{row.get('speedup', 1.0):7.2f}x {100 * row.get('cost_reduction', 0.0):7.1f}% "
                f"{row.get('generation_speedup', 1.0):5.2f}x {100 * row.get('generation_cost_reduction', 0.0):8.1f}% "
                f"{row['mean_generation_time']:7.1f} {row['generation_over_floor']:6.2f}x "
                f"{row['mean_generation_cost']:7.3f} {row['cost_over_floor']:6.2f}x "
                f"{row.get('bound_speedup', 1.0):7.2f}x {100 * row.get('bound_cost_reduction', 0.0):8.1f}%"
            )
        floor = rows["verl"] if "verl" in rows else next(iter(rows.values()))
        lines.append(
            f"{'  floor (simulated)':34s} {'':12s} generation {floor['mean_floor_time']:.1f} s "
            f"(latency {floor['mean_floor_latency']:.1f}, throughput {floor['mean_floor_throughput']:.1f}); "
            f"work {floor['mean_floor_cost']:.3f} $"
        )
        bound = rows.get("rlhfless", {})
        if "generation_bound_speedup" in bound:
            lines.append(
                f"{'  generation at its floors':34s} {'':12s} {bound['generation_bound_speedup']:.2f}x verl's "
                f"speed, {100 * bound['generation_bound_cost_reduction']:.1f}% cheaper (no schedule does better)"
            )
        pilot = rows.get("rlhfless", floor)
        if pilot.get("pilot_prompts"):
            lines.append(
                f"{'  length pilot (simulated)':34s} {'':12s} {pilot['pilot_prompts']:.0f} prompt(s) before "
                f"the first step, {pilot['pilot_seconds']:.1f} s, {pilot['pilot_cost']:.3f} $ (in no step's figures)"
            )
    lines.append("")
    lines.append(f"{'RLHFless vs verl':38s} {'speedup':>9s} {'cost reduction':>15s}")
    paper = PAPER.get(name)
    if paper:
        lines.append(
            f"{'paper, ' + paper['label'] + ' (reported)':38s} {paper['speedup']:8.2f}x "
            f"{100 * paper['cost_reduction']:14.1f}%"
        )
    label = str(headline["label"])
    lines.append(
        f"{'this run, ' + label + ', whole step':38s} {headline['speedup']:8.2f}x "
        f"{100 * headline['cost_reduction']:14.1f}%"
    )
    lines.append(
        f"{'this run, ' + label + ', generation':38s} {headline['generation_speedup']:8.2f}x "
        f"{100 * headline['generation_cost_reduction']:14.1f}%"
    )
    lines.append(
        f"{'this run, ' + label + ', whole step bound':38s} {headline['bound_speedup']:8.2f}x "
        f"{100 * headline['bound_cost_reduction']:14.1f}%"
    )
    lines.append(
        f"{'this run, ' + label + ', generation bound':38s} {headline['generation_bound_speedup']:8.2f}x "
        f"{100 * headline['generation_bound_cost_reduction']:14.1f}%"
    )
    lines.append(
        f"rlhfless generation over its floor: time {headline['generation_over_floor']:.2f}x, "
        f"cost {headline['cost_over_floor']:.2f}x ({label})"
    )
    lines.append(
        "(simulated; learning and preparation run on every GPU under both policies; 'bound': the "
        "whole step with generation at its floor; 'generation bound': generation at its time and work "
        "floors; gen s / gen $ over the generation and work floors; tp: GPUs per decode actor, the mean "
        "over steps)"
    )
    return "\n".join(lines)
