"""Matplotlib figures of recorded runs, drawn off-screen (Agg) without pyplot's global state.

Every function takes already-validated records (`rundir`) and returns a `Figure`; deciding what is
missing and saying so is the page builder's job, so a panel with nothing to draw only says so.
"""

from __future__ import annotations

import io

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from rlhfless.report.rundir import Run, Timeline
from rlhfless.report.stats import (
    FORECASTS,
    WITHIN_TOKENS,
    group_lengths,
    node_labels,
    phase_parts,
    predictor_score,
)

WIDTH = 13.0
DPI = 100
MAX_BOXES = 30
KIND_ORDER = ("learner", "prefill", "decode", "reference", "reward", "critic")
KIND_COLORS = {
    "learner": "#1f77b4",
    "prefill": "#17becf",
    "decode": "#2ca02c",
    "reference": "#9467bd",
    "reward": "#8c564b",
    "critic": "#e377c2",
}
COLD_COLOR, IDLE_COLOR = "#ff7f0e", "#d9d9d9"
EVENT_STYLE = {
    "cut": ("|", "#d62728", "cut"),
    "migrate_out": (">", "#6a3d9a", "migrate out"),
    "migrate_in": ("<", "#b15928", "migrate in"),
    "fault": ("X", "black", "fault"),
}


def run_color(index: int) -> tuple[float, ...]:
    """The colour of the index-th run, the same in every figure of the page."""
    return matplotlib.colormaps["tab10"](index % 10)


def png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _every(points) -> int:
    """Mark every k-th point so that long runs show lines, not a solid row of markers."""
    return max(1, len(points) // 30)


def _steps_axis(ax: Axes) -> None:
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _line(ax: Axes, runs: list[Run], key: str, *, style: str = "-", label_suffix: str = "") -> bool:
    drew = False
    for i, run in enumerate(runs):
        steps, values = run.series(key)
        if steps:
            # Earlier runs are drawn wider, so runs with identical curves stay visible under each other.
            width = 1.5 + 2.5 * (len(runs) - 1 - i)
            ax.plot(
                steps,
                values,
                style,
                color=run_color(i),
                marker=".",
                markevery=_every(steps),
                linewidth=width,
                label=run.name + label_suffix,
            )
            drew = True
    return drew


def curves(runs: list[Run]) -> Figure:
    """Reward (with std band, and the held-out reward where validated), KL, response length (mean
    and max) and loss per step."""
    fig = Figure(figsize=(WIDTH, 7), layout="constrained")
    axes = fig.subplots(2, 2).ravel()
    panels = [
        ("reward", [("reward/mean", "-", "")]),
        ("KL to reference", [("kl/mean", "-", "")]),
        (
            "response length (tokens)",
            [("response_length/mean", "-", " mean"), ("response_length/max", ":", " max")],
        ),
        ("loss", [("loss/policy", "-", " policy"), ("loss/value", "--", " value")]),
    ]
    for ax, (title, keys) in zip(axes, panels, strict=True):
        drew = False
        for key, style, suffix in keys:
            drew |= _line(ax, runs, key, style=style, label_suffix=suffix if len(keys) > 1 else "")
        if not drew:
            _empty(ax, f"{title}: not recorded")
        ax.set_title(title)
        if drew:
            _steps_axis(ax)
            ax.legend(fontsize="small")
    for i, run in enumerate(runs):
        steps, mean = run.series("reward/mean")
        std = dict(zip(*run.series("reward/std"), strict=True))
        both = [s for s in steps if s in std]
        if both:
            m = np.array([run.metrics[s]["reward/mean"] for s in both])
            sd = np.array([std[s] for s in both])
            axes[0].fill_between(both, m - sd, m + sd, color=run_color(i), alpha=0.15, linewidth=0)
        held_out, values = run.held_out("val/reward/mean")
        if held_out:
            axes[0].plot(held_out, values, "--s", color=run_color(i), label=f"{run.name} held-out")
            axes[0].legend(fontsize="small")
            _steps_axis(axes[0])
    return fig


def cost_time(runs: list[Run]) -> Figure:
    """Time and cost per step, and each step as a (time, cost) point: one colour per run."""
    fig = Figure(figsize=(WIDTH, 4), layout="constrained")
    ax_time, ax_cost, ax_scatter = fig.subplots(1, 3)
    for ax, key, title in ((ax_time, "time/step", "step time (s)"), (ax_cost, "cost/step", "cost per step")):
        ax.set_title(title)
        if _line(ax, runs, key):
            _steps_axis(ax)
            ax.legend(fontsize="small")
        else:
            _empty(ax, f"`{key}` not recorded")
    ax_scatter.set_title("cost vs time, one point per step")
    drew = False
    for i, run in enumerate(runs):
        steps = [s for s in run.steps if {"time/step", "cost/step"} <= run.metrics[s].keys()]
        if steps:
            t = [run.metrics[s]["time/step"] for s in steps]
            c = [run.metrics[s]["cost/step"] for s in steps]
            ax_scatter.scatter(t, c, color=run_color(i), label=run.name, alpha=0.8)
            drew = True
    if drew:
        ax_scatter.set_xlabel("step time (s)")
        ax_scatter.set_ylabel("cost")
        ax_scatter.legend(fontsize="small")
    else:
        _empty(ax_scatter, "needs `time/step` and `cost/step`")
    return fig


def forecast(runs: list[Run]) -> Figure:
    """Forecast (dashed) against actual (solid) per step: generation and whole-step time and cost,
    with a run's budget or deadline as a dotted line, crossed where a step missed it."""
    fig = Figure(figsize=(WIDTH, 6.5), layout="constrained")
    axes = fig.subplots(2, 2).ravel()
    targets = {"step time (s)": "target/deadline_per_step", "step cost ($)": "target/budget_per_step"}
    for ax, (label, key, actual) in zip(axes, FORECASTS, strict=True):
        ax.set_title(label)
        drew = _line(ax, runs, actual, label_suffix=" actual")
        drew |= _line(ax, runs, key, style="--", label_suffix=" forecast")
        target = targets.get(label)
        if target is not None:
            drew |= _line(ax, runs, target, style=":", label_suffix=" " + target.split("/")[1])
            _missed(ax, runs, target)
        if drew:
            _steps_axis(ax)
            ax.legend(fontsize="small")
        else:
            _empty(ax, f"`{key}` / `{actual}` not recorded")
    return fig


def _missed(ax: Axes, runs: list[Run], target: str) -> None:
    """A cross on the target line at each step no plan fitted, which took the nearest one
    (`scheduler.target_miss=nearest`: `target/missed`)."""
    for i, run in enumerate(runs):
        steps, missed = run.series("target/missed")
        steps = [s for s, m in zip(steps, missed, strict=True) if m and target in run.metrics[s]]
        if steps:
            values = [run.metrics[s][target] for s in steps]
            ax.plot(steps, values, "x", color=run_color(i), markersize=9, label=f"{run.name} missed")


def _function_order(timeline: Timeline) -> list:
    def key(f):
        rank = KIND_ORDER.index(f.kind) if f.kind in KIND_ORDER else len(KIND_ORDER)
        return rank, f.started, f.name

    return sorted(timeline.functions, key=key)


def function_labels(timeline: Timeline, functions: list) -> list[str]:
    """Each row's label: name, resources, and the node it ran on (`@ n0` is the driver's)."""
    nodes = node_labels(timeline)
    labels = []
    for f in functions:
        res = ",".join(f"{k}:{v:g}" for k, v in f.resources.items())
        label = f"{f.name} ({res})" if res else f.name
        labels.append(label if f.node is None else f"{label} @ {nodes[f.node]}")
    return labels


def _timeline_axes(ax: Axes, run_name: str, timeline: Timeline) -> None:
    functions = _function_order(timeline)
    for row, f in enumerate(functions):
        y = len(functions) - 1 - row
        if f.requested is not None and f.requested < f.started:
            ax.plot([f.requested, f.started], [y, y], color="0.5", linestyle=":", linewidth=1)
        warm_from = f.ready if f.ready is not None else f.started
        ax.barh(y, f.released - warm_from, left=warm_from, height=0.6, color=IDLE_COLOR)
        if f.ready is not None and f.ready > f.started:
            ax.barh(y, f.ready - f.started, left=f.started, height=0.6, color=COLD_COLOR)
        color = KIND_COLORS.get(f.kind, "0.3")
        for a, b in f.busy:
            ax.barh(y, b - a, left=a, height=0.6, color=color)
        for event in f.events:
            marker, ecolor, _ = EVENT_STYLE.get(event.kind, ("*", "black", event.kind))
            cut = event.kind == "cut"
            # A cut is a tall tick and a migration a smaller arrow, so both show when they coincide;
            # the count (sequences cut or moved) sits left of a cut and right of anything else.
            if cut:
                ax.vlines(event.t, y - 0.45, y + 0.45, color=ecolor, linewidth=3, zorder=3)
            else:
                ax.plot(event.t, y, marker=marker, color=ecolor, markersize=9, markeredgewidth=2.5, zorder=4)
            if event.n is not None:
                ax.annotate(
                    f"{event.n} " if cut else f" {event.n}",
                    (event.t, y + 0.38),
                    ha="right" if cut else "left",
                    fontsize=7,
                    color=ecolor,
                )
        if f.cost is not None:
            ax.annotate(f" {f.cost:.3g}", (f.released, y), va="center", fontsize=8, color="0.3")
    labels = function_labels(timeline, functions)
    ax.set_yticks(range(len(functions)), labels[::-1], fontsize=8)
    total = sum(f.cost for f in functions if f.cost is not None)
    nodes = len({f.node for f in functions if f.node is not None})
    where = f" on {nodes} node{'s' if nodes > 1 else ''}" if nodes else ""
    ax.set_title(f"{run_name}: step {timeline.step}, {len(functions)} functions{where}, cost {total:.3g}")
    ax.set_xlabel("seconds from step start (bar end: function cost)")
    ax.margins(x=0.06)


def timeline(run_name: str, timelines: list[Timeline]) -> Figure:
    """One bar per function: cold start, busy and idle shaded; cut and migration moments marked."""
    rows = [max(len(t.functions), 1) for t in timelines]
    fig = Figure(figsize=(WIDTH, 1.6 + sum(0.38 * r + 1.0 for r in rows)), layout="constrained")
    axes = fig.subplots(len(timelines), 1, squeeze=False, height_ratios=rows)[:, 0]
    for ax, tl in zip(axes, timelines, strict=True):
        if tl.functions:
            _timeline_axes(ax, run_name, tl)
        else:
            _empty(ax, f"{run_name}: step {tl.step} recorded no drawable function")
    kinds = sorted({f.kind for t in timelines for f in t.functions}, key=lambda k: (k not in KIND_ORDER, k))
    events = sorted({e.kind for t in timelines for f in t.functions for e in f.events})
    handles = [Patch(color=COLD_COLOR, label="cold start"), Patch(color=IDLE_COLOR, label="idle")]
    handles += [Patch(color=KIND_COLORS.get(k, "0.3"), label=f"busy: {k}") for k in kinds]
    for kind in events:
        marker, color, label = EVENT_STYLE.get(kind, ("*", "black", kind))
        handles.append(Line2D([], [], marker=marker, color=color, linestyle="", markersize=10, label=label))
    fig.legend(handles=handles, loc="outside upper center", ncol=min(len(handles), 8), fontsize="small")
    return fig


PHASE_COLORS = {"preparation": "#9467bd", "generation": "#2ca02c", "learning": "#1f77b4"}


def phases(runs: list[Run]) -> Figure:
    """Stacked seconds per phase for every step, with the measured step time as a marker."""
    fig = Figure(figsize=(WIDTH, 3.6 * len(runs)), layout="constrained")
    axes = fig.subplots(len(runs), 1, squeeze=False, sharey=True)[:, 0]
    overhead_colors = [matplotlib.colormaps["tab10"](k) for k in (1, 3, 5, 6, 7, 8, 9)]
    for ax, run in zip(axes, runs, strict=True):
        steps = run.steps
        bottom = np.zeros(len(steps))
        overheads = 0
        for label, values in phase_parts(run).items():
            color = PHASE_COLORS.get(label)
            if color is None:
                color, overheads = overhead_colors[overheads % len(overhead_colors)], overheads + 1
            ax.bar(steps, values, bottom=bottom, color=color, label=label, width=0.8)
            bottom += np.asarray(values)
        step_steps, step_times = run.series("time/step")
        if step_steps:
            ax.plot(
                step_steps, step_times, "k_", markersize=14, markeredgewidth=2, label="measured step time"
            )
        ax.set_title(f"{run.name}: seconds per step by phase")
        _steps_axis(ax)
        ax.set_ylabel("seconds")
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def _even(items: list[int], most: int) -> list[int]:
    if len(items) <= most:
        return items
    return [items[i] for i in np.linspace(0, len(items) - 1, most).round().astype(int)]


def lengths(runs: list[Run]) -> Figure:
    """Per run: response-length distribution per step, predicted vs actual group max, accuracy per step."""
    fig = Figure(figsize=(WIDTH, 3.8 * len(runs)), layout="constrained")
    axes = fig.subplots(len(runs), 3, squeeze=False, width_ratios=[1.6, 1, 1])
    for (ax_box, ax_pred, ax_acc), run in zip(axes, runs, strict=True):
        shown = _even([s for s in sorted(run.rollouts) if run.rollouts[s]], MAX_BOXES)
        data = [[x.response_tokens for x in run.rollouts[s] if x.response_tokens is not None] for s in shown]
        kept = [(s, d) for s, d in zip(shown, data, strict=True) if d]
        ax_box.set_title(f"{run.name}: response tokens per step")
        if kept:
            ax_box.boxplot([d for _, d in kept], tick_labels=[str(s) for s, _ in kept])
            ax_box.set_xlabel("step")
            ax_box.tick_params(axis="x", labelsize=7)
        else:
            _empty(ax_box, "no `response_tokens` in rollouts")
        per_step = {s: group_lengths(run.rollouts[s]) for s in sorted(run.rollouts)}
        per_step = {s: v for s, v in per_step.items() if len(v[0])}
        if not per_step:
            for ax in (ax_pred, ax_acc):
                _empty(ax, "no `predicted_length` in rollouts")
            continue
        pred = np.concatenate([p for p, _ in per_step.values()])
        act = np.concatenate([a for _, a in per_step.values()])
        step_of = np.concatenate([[s] * len(p) for s, (p, _) in per_step.items()])
        points = ax_pred.scatter(pred, act, c=step_of, cmap="viridis", s=14, alpha=0.8)
        top = float(max(pred.max(), act.max(), 1.0))
        ax_pred.plot([0, top], [0, top], "k-", linewidth=1)
        ax_pred.fill_between(
            [0, top],
            [-WITHIN_TOKENS, top - WITHIN_TOKENS],
            [WITHIN_TOKENS, top + WITHIN_TOKENS],
            color="0.5",
            alpha=0.15,
            label=f"within {WITHIN_TOKENS} tokens",
        )
        score = predictor_score(pred, act)
        tau = "n/a" if score.tau is None else f"{score.tau:.2f}"
        ax_pred.set_title(f"group max: within {WITHIN_TOKENS} {score.within:.0%}, Kendall tau {tau}")
        ax_pred.set_xlabel("predicted tokens")
        ax_pred.set_ylabel("actual tokens")
        ax_pred.legend(fontsize="small", loc="upper left")
        ax_pred.set_xlim(0, top * 1.05)
        ax_pred.set_ylim(0, top * 1.05)
        fig.colorbar(points, ax=ax_pred, label="step", ticks=MaxNLocator(integer=True))
        scores = {s: predictor_score(p, a) for s, (p, a) in per_step.items()}
        ax_acc.plot(
            list(scores),
            [v.within for v in scores.values()],
            "o-",
            markevery=_every(scores),
            label=f"within {WITHIN_TOKENS}",
        )
        taus = [(s, v.tau) for s, v in scores.items() if v.tau is not None]
        if taus:
            ax_acc.plot(*zip(*taus, strict=True), "s--", markevery=_every(taus), label="Kendall tau")
        ax_acc.set_ylim(-1.05, 1.05)
        ax_acc.axhline(0, color="0.7", linewidth=0.8)
        ax_acc.set_title("predictor accuracy per step")
        _steps_axis(ax_acc)
        ax_acc.legend(fontsize="small")
    return fig


def predicted_actual(run: Run, kind: str) -> tuple[list[int], list[float]]:
    """The plan's predicted generation time or cost per step: the logged metric, else the chosen candidate."""
    steps, values = [], []
    for step in sorted(set(run.steps) | set(run.plans)):
        value = run.metrics.get(step, {}).get(f"plan/predicted_{kind}")
        chosen = run.plans[step].chosen if step in run.plans else None
        if value is None and chosen is not None:
            value = chosen.time if kind == "time" else chosen.cost
        if value is not None:
            steps.append(step)
            values.append(value)
    return steps, values


def scaling(run: Run) -> Figure:
    """Candidate scores per step with the chosen N, and predicted vs actual generation time and cost."""
    fig = Figure(figsize=(WIDTH, 3.8), layout="constrained")
    ax_score, ax_time, ax_cost = fig.subplots(1, 3)
    plans = [run.plans[s] for s in sorted(run.plans)]
    ns = sorted({c.n for p in plans for c in p.candidates})
    if ns:
        grid = np.full((len(ns), len(plans)), np.nan)
        for j, plan in enumerate(plans):
            for c in plan.candidates:
                grid[ns.index(c.n), j] = c.score
        image = ax_score.imshow(
            grid, aspect="auto", origin="lower", cmap="viridis_r", interpolation="nearest"
        )
        fig.colorbar(image, ax=ax_score, label="score (lower is better)")
        chosen = [(j, ns.index(p.n_actors)) for j, p in enumerate(plans) if p.n_actors in ns]
        if chosen:
            size = 6 if len(plans) <= 40 else 3
            ax_score.plot(
                *zip(*chosen, strict=True), "wo", markeredgecolor="k", markersize=size, label="chosen N"
            )
            ax_score.legend(fontsize="small", loc="upper right")
        ax_score.set_xticks(*_ticks([p.step for p in plans]))
        ax_score.set_yticks(range(len(ns)), [str(n) for n in ns])
        ax_score.set_xlabel("step")
        ax_score.set_ylabel("decode actors N")
    else:
        _empty(ax_score, "plans have no candidate table")
    ax_score.set_title(f"{run.name}: candidate scores")
    for ax, kind, unit in ((ax_time, "time", "seconds"), (ax_cost, "cost", "cost")):
        drew = False
        steps, values = predicted_actual(run, kind)
        if steps:
            ax.plot(steps, values, "o--", markevery=_every(steps), label="predicted (plan)")
            drew = True
        for key, style in ((f"{kind}/generation", "s-"), (f"{kind}/step", "^:")):
            steps, values = run.series(key)
            if steps:
                ax.plot(steps, values, style, markevery=_every(steps), label=f"actual `{key}`")
                drew = True
        ax.set_title(f"predicted vs actual {kind}")
        if drew:
            _steps_axis(ax)
            ax.set_ylabel(unit)
            ax.legend(fontsize="small")
        else:
            _empty(ax, f"no predicted or actual {kind}")
    return fig


def _ticks(steps: list[int]) -> tuple[list[int], list[str]]:
    positions = _even(list(range(len(steps))), 15)
    return positions, [str(steps[j]) for j in positions]
