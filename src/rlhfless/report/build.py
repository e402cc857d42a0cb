"""Assemble the report page of one or more recorded runs: what each section shows or why it cannot."""

from __future__ import annotations

from html import escape
from pathlib import Path

import matplotlib
import numpy as np

from rlhfless.files import write_atomic
from rlhfless.report import figures
from rlhfless.report.cells import fmt, image, seconds, size
from rlhfless.report.page import Section, render, table
from rlhfless.report.planning import floor_section, forecast_section, scaling_section
from rlhfless.report.rundir import Run, Timeline, load_run, run_names
from rlhfless.report.stats import (
    PHASES,
    WITHIN_TOKENS,
    compare_runs,
    group_lengths,
    node_labels,
    phase_parts,
    planner_seconds,
    predictor_score,
    subphase_parts,
    transfer_totals,
)

CURVE_KEYS = ("reward/mean", "kl/mean", "response_length/mean", "loss/policy")


def _runs_section(runs: list[Run]) -> Section:
    section = Section("runs", "Runs")
    rows = [
        [
            run.name,
            str(run.path),
            str(len(run.metrics)),
            str(len(run.rollouts)),
            str(len(run.plans)),
            str(len(run.timelines)),
            _held_out(run),
        ]
        for run in runs
    ]
    header = ["run", "directory", "steps", "rollouts", "plans", "timelines", "held-out reward"]
    section.html.append(table(header, rows))
    for run in runs:
        if run.problems:
            items = "".join(f"<li>{escape(p)}</li>" for p in run.problems)
            section.html.append(
                f"<p>{escape(run.name)}: unreadable parts</p><ul class='problems'>{items}</ul>"
            )
        if run.config_text is not None:
            section.html.append(
                f"<details><summary>{escape(run.name)}: config.yaml</summary>"
                f"<pre>{escape(run.config_text)}</pre></details>"
            )
        else:
            section.notes.append(f"{run.name}: no config.yaml")
    return section


def _held_out(run: Run) -> str:
    """The first and the last validation's held-out reward, with their steps ("-": not validated)."""
    steps, values = run.held_out("val/reward/mean")
    if not steps:
        return "-"
    return f"{fmt(values[0])} (step {steps[0]}) to {fmt(values[-1])} (step {steps[-1]})"


def _comparison_section(runs: list[Run]) -> Section:
    section = Section(
        "comparison",
        "Comparison",
        f"Means over recorded steps; speedup and cost reduction are relative to the first run "
        f"({runs[0].name}); samples compare response text per (step, uid, sample).",
    )
    if len({tuple(run.steps) for run in runs}) > 1:
        section.notes.append("the runs recorded different steps: each mean is over that run's own steps")
    for run in runs:
        for key in ("time/step", "cost/step"):
            if not run.has(key):
                section.notes.append(f"{run.name}: no `{key}` in metrics.jsonl")
    rows = [
        [
            c.name,
            str(c.steps),
            fmt(c.mean_step_time, ".2f", " s"),
            fmt(c.mean_step_cost, ".4g"),
            fmt(c.speedup, ".2f", "x"),
            fmt(None if c.cost_reduction is None else 100 * c.cost_reduction, ".1f", "%"),
            c.samples,
        ]
        for c in compare_runs(runs)
    ]
    header = ["run", "steps", "mean step time", "cost per step", "speedup", "cost reduction", "samples"]
    section.html.append(table(header, rows))
    return section


def _curves_section(runs: list[Run], out: Path) -> Section:
    section = Section(
        "curves",
        "Training curves",
        "Reward (band: one std; dashed, squares: the held-out reward of each validation, step 0 the "
        "initial policy's), KL, response length and loss per step.",
    )
    for run in runs:
        missing = [k for k in CURVE_KEYS if not run.has(k)]
        if missing:
            section.notes.append(f"{run.name}: not recorded: {', '.join(f'`{k}`' for k in missing)}")
    if any(run.has(k) for run in runs for k in CURVE_KEYS):
        section.images.append(
            image(out, "curves", figures.curves(runs), "reward, KL, length and loss per step")
        )
    rows = [row for run in runs for row in _held_out_sources(run)]
    if rows:
        header = ["run", "held-out data source", "first validation", "last validation"]
        section.html.append(table(header, rows))
    return section


def _held_out_sources(run: Run) -> list[list[str]]:
    """Each data source's held-out reward at the run's first and last validation (VERL's
    test_score per source): one row per source."""
    prefix = "val/source/"
    rows = []
    for key in sorted({k for v in run.validations.values() for k in v if k.startswith(prefix)}):
        steps, values = run.held_out(key)
        first, last = f"{fmt(values[0])} (step {steps[0]})", f"{fmt(values[-1])} (step {steps[-1]})"
        rows.append([run.name, key[len(prefix) :], first, last])
    return rows


def _cost_time_section(runs: list[Run], out: Path) -> Section:
    section = Section("cost-time", "Cost and time per step", "One colour per run.")
    for run in runs:
        if not run.has("time/step"):
            section.notes.append(f"{run.name}: no `time/step` in metrics.jsonl")
        if not run.has("cost/step"):
            section.notes.append(
                f"{run.name}: no `cost/step` in metrics.jsonl (cost is billed only by the serverless runtime)"
            )
    if any(run.has(k) for run in runs for k in ("time/step", "cost/step")):
        section.images.append(
            image(out, "cost-time", figures.cost_time(runs), "time and cost per step; cost vs time per step")
        )
    return section


def _timeline_section(runs: list[Run], out: Path) -> Section:
    section = Section(
        "timeline",
        "Step timeline",
        "One bar per function (first and last recorded step): orange cold start, grey idle, coloured busy; "
        "markers at cuts and migrations; dotted line: waiting for resources; number at bar end: its cost; "
        "`@ n0`: the node it ran on (n0 is the driver's). Below: the nodes each shown step was planned "
        "for, and every recorded step's transfers, inside a node (shared memory) or across nodes.",
    )
    for i, run in enumerate(runs):
        if not run.timelines:
            section.notes.append(
                f"{run.name}: no timeline/step_*.json files (the in-process executor records no timeline)"
            )
            continue
        steps = sorted(run.timelines)
        shown = [run.timelines[s] for s in dict.fromkeys([steps[0], steps[-1]])]
        fig = figures.timeline(run.name, shown)
        caption = f"{run.name}: function timeline of step(s) {', '.join(str(t.step) for t in shown)}"
        section.images.append(image(out, f"timeline-{i}", fig, caption))
        if not any(t.has_nodes for t in run.timelines.values()):
            section.notes.append(
                f"{run.name}: timelines record no nodes (recorded since multi-node placement)"
            )
            continue
        section.html.append(
            f"<p>{escape(run.name)}: nodes of step(s) {', '.join(str(t.step) for t in shown)}</p>"
        )
        section.html.append(_nodes_table(shown))
        totals = transfer_totals(list(run.timelines.values()))
        if not totals:
            section.notes.append(f"{run.name}: timelines record no transfers")
            continue
        rows = [
            [
                t.kind,
                "within a node" if t.same_node else "across nodes",
                str(t.count),
                size(t.bytes),
                seconds(t.seconds),
            ]
            for t in totals
        ]
        section.html.append(
            f"<p>{escape(run.name)}: transfers over {len(run.timelines)} recorded step(s)</p>"
        )
        section.html.append(table(["transfer", "where", "count", "bytes", "seconds"], rows))
    return section


def _nodes_table(timelines: list[Timeline]) -> str:
    """One row per (step, node): the node's slots as planned and the functions that ran there."""
    rows = []
    for tl in timelines:
        labels = node_labels(tl)
        planned = {n.node: n for n in tl.nodes}
        for node, label in labels.items():
            n = planned.get(node)
            ran = [f.name for f in tl.functions if f.node == node and f.kind != "keep-alive"]
            rows.append(
                [
                    str(tl.step),
                    label + (" (driver)" if n is not None and n.driver else ""),
                    node[:12],
                    "n/a" if n is None else n.address,
                    "n/a" if n is None else f"{fmt(n.free, 'd')} of {fmt(n.slots, 'd')}",
                    ", ".join(ran) or "none",
                ]
            )
    return table(["step", "node", "id", "address", "free slots (planned)", "functions run there"], rows)


def _phase_section(runs: list[Run], out: Path) -> Section:
    section = Section(
        "phases",
        "Phase breakdown per step",
        "Stacked seconds of preparation, generation and learning, then the overheads the run recorded: "
        "planner, dedup (`time/dedup`), weight sync, KV transfer, I/O (`time/io`). Overheads may overlap "
        "the phases; the black mark is the measured step time.",
    )
    drawn = []
    for run in runs:
        missing = [f"`{k}`" for k, _ in PHASES if not run.has(k)]
        if planner_seconds(run) is None:
            missing.append("planner time (`time/plan` or plan files)")
        missing += [f"`{k}`" for k in ("time/weight_sync", "time/kv_transfer") if not run.has(k)]
        if missing:
            section.notes.append(f"{run.name}: not recorded: {', '.join(missing)}")
        if any(run.has(k) for k, _ in PHASES):
            drawn.append(run)
    if not drawn:
        return section
    section.images.append(image(out, "phases", figures.phases(drawn), "seconds per step by phase"))
    for run in drawn:
        step_time = np.mean(run.series("time/step")[1]) if run.has("time/step") else None
        rows = []
        for label, values in (phase_parts(run) | subphase_parts(run)).items():
            mean = float(np.mean(values))
            share = None if not step_time else 100 * mean / step_time
            rows.append([label, seconds(mean), "<0.1%" if share and share < 0.05 else fmt(share, ".1f", "%")])
        section.html.append(f"<p>{escape(run.name)}: mean per step</p>")
        section.html.append(table(["phase", "mean", "share of step time"], rows))
    return section


def _lengths_section(runs: list[Run], out: Path) -> Section:
    section = Section(
        "lengths",
        "Response lengths and the length predictor",
        f"Distribution of response tokens per step; each prompt's predicted group max length against the "
        f"generated group max (band: within {WITHIN_TOKENS} tokens); share within {WITHIN_TOKENS} tokens "
        f"and Kendall rank correlation per step.",
    )
    drawn = []
    for run in runs:
        if not run.rollouts:
            section.notes.append(f"{run.name}: no rollouts/step_*.jsonl files")
            continue
        drawn.append(run)
        pairs = [group_lengths(rows) for rows in run.rollouts.values()]
        pred = np.concatenate([p for p, _ in pairs])
        act = np.concatenate([a for _, a in pairs])
        score = predictor_score(pred, act)
        if score is None:
            section.notes.append(f"{run.name}: rollouts carry no `predicted_length` (no planner in this run)")
            continue
        section.html.append(
            f"<p>{escape(run.name)}: over {score.groups} prompt groups, {score.within:.0%} predicted within "
            f"{WITHIN_TOKENS} tokens of the actual group max; Kendall tau {fmt(score.tau, '.2f')}.</p>"
        )
    if drawn:
        section.images.insert(
            0,
            image(out, "lengths", figures.lengths(drawn), "response lengths and predicted vs actual lengths"),
        )
    return section


def write_report(run_dirs: list[Path], out: Path | None = None) -> Path:
    """Write `out` (default `run_dirs[0]/report.html`) and its PNGs beside it; return the page's path.

    Reads only recorded files, so it works on finished, interrupted or partially recorded runs alike.
    """
    if not run_dirs:
        raise ValueError("run_dirs: got an empty list, expected at least one run directory")
    run_dirs = [Path(p) for p in run_dirs]
    out = Path(out) if out is not None else run_dirs[0] / "report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    runs = [load_run(path, name) for path, name in zip(run_dirs, run_names(run_dirs), strict=True)]
    # Run names are directory names: a `$` in one must print as is, not start TeX math.
    with matplotlib.rc_context({"text.parse_math": False}):
        sections = [
            _runs_section(runs),
            _comparison_section(runs),
            _curves_section(runs, out),
            _cost_time_section(runs, out),
            _timeline_section(runs, out),
            _phase_section(runs, out),
            _lengths_section(runs, out),
            forecast_section(runs, out),
            floor_section(runs),
            scaling_section(runs, out),
        ]
    for section in sections:
        for shown in section.images:
            write_atomic(out.parent / f"{shown.name}.png", shown.png)
    title = "RLHFless report: " + " vs ".join(run.name for run in runs)
    write_atomic(out, render(title, f"{len(runs)} run(s)", sections))
    return out
