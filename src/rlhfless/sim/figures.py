"""PNG figures of a simulation (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rlhfless.sim.step import StepResult  # noqa: E402

TITLE_SUFFIX = " (simulated)"


def ablation_scatter(results: dict[str, list[StepResult]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for name, steps in results.items():
        ax.scatter([s.time for s in steps], [s.cost for s in steps], label=name, s=14)
    ax.set_xlabel("step time (s)")
    ax.set_ylabel("cost per step (USD)")
    ax.set_title("Ablation: per-step cost vs time" + TITLE_SUFFIX)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bars(summary: dict[str, dict[str, float]], names: tuple[str, ...], path: Path, title: str) -> None:
    names = tuple(n for n in names if n in summary)
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.5))
    for ax, key, label in (
        (axes[0], "mean_step_time", "step time (s)"),
        (axes[1], "mean_cost", "cost per step (USD)"),
    ):
        ax.bar(
            names, [summary[n][key] for n in names], color=["tab:gray", "tab:blue", "tab:orange", "tab:green"]
        )
        ax.set_ylabel(label)
    fig.suptitle(title + TITLE_SUFFIX)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def sweep_plot(rows: list[dict[str, Any]], xlabel: str, path: Path, title: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [r["value"] for r in rows]
    ax.plot(xs, [r["time"] for r in rows], "o-", color="tab:blue")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("mean step time (s)", color="tab:blue")
    twin = ax.twinx()
    twin.plot(xs, [r["cost"] for r in rows], "s--", color="tab:red")
    twin.set_ylabel("mean cost per step (USD)", color="tab:red")
    ax.set_title(title + TITLE_SUFFIX)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def scalability_plot(rows: list[dict[str, Any]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [r["value"] for r in rows]
    ax.plot(xs, [r["speedup"] for r in rows], "o-", label="speedup vs verl")
    ax.plot(xs, [1 + r["cost_reduction"] for r in rows], "s-", label="1 + cost reduction vs verl")
    ax.set_xlabel("nodes")
    ax.set_ylabel("ratio")
    twin = ax.twinx()
    twin.plot(xs, [r["plan_ms"] for r in rows], "^--", color="tab:gray", label="planner ms per step")
    twin.set_ylabel("planner overhead (ms per step)")
    ax.legend(loc="upper left")
    twin.legend(loc="upper right")
    ax.set_title("Scalability" + TITLE_SUFFIX)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
