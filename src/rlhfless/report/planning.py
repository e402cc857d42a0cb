"""The report's sections on what the planner decided and forecast: forecast against actual,
generation over its floor, and each step's scaling decision."""

from __future__ import annotations

from html import escape
from pathlib import Path

import numpy as np

from rlhfless.report import figures
from rlhfless.report.cells import fmt, image, seconds
from rlhfless.report.page import Section, table
from rlhfless.report.rundir import Run
from rlhfless.report.stats import FORECAST_GOAL, forecast_scores, run_outcome

TABLE_STEPS = 30


def candidate_table(run: Run, step: int) -> str:
    plan = run.plans[step]
    header = ["N", "predicted time (s)", "predicted cost", "score"]
    rows = [[str(c.n), f"{c.time:.4g}", f"{c.cost:.4g}", f"{c.score:.3g}"] for c in plan.candidates]
    if any(c.hidden is not None for c in plan.candidates):
        header.append("transfer hidden")
        for row, c in zip(rows, plan.candidates, strict=True):
            row.append({True: "yes", False: "no", None: "n/a"}[c.hidden])
    if plan.time_cap is not None:
        header.append("within verl's cap")
        for row, c in zip(rows, plan.candidates, strict=True):
            row.append("yes" if c.time + c.wait <= plan.time_cap * (1 + 1e-9) else "no")
    classes = ["chosen" if c.n == plan.n_actors else "" for c in plan.candidates]
    metrics = run.metrics.get(step, {})
    actual = (
        f"actual generation time {fmt(metrics.get('time/generation'), '.4g')} s, "
        f"cost {fmt(metrics.get('cost/generation'), '.4g')}"
    )
    head = (
        f"<p>step {step}: chosen N = {fmt(plan.n_actors, 'd')}, policy {escape(plan.policy or 'n/a')}, "
        f"planned in {fmt(None if plan.plan_seconds is None else 1000 * plan.plan_seconds, '.3g', ' ms')}; "
        f"{escape(actual)}"
        + (
            ""
            if plan.time_cap is None
            else f"; verl's cap {plan.time_cap:.4g} s (its plan's forecast x max_slowdown, divided by "
            "the run's shortfall so far; a candidate's time counts with learning's wait for its ranks)"
        )
        + "</p>"
    )
    if not plan.candidates:
        return head + '<p class="missing">no candidate table in this plan</p>'
    return head + table(header, rows, classes)


def forecast_section(runs: list[Run], out: Path) -> Section:
    section = Section(
        "forecast",
        "Forecast against actual",
        f"What each step's plan forecast (dashed) beside what it measured (solid); the share of steps "
        f"after the first whose forecast landed within {FORECAST_GOAL:.0%}; and the whole run's "
        f"forecast made before step 1 (forecast.json) beside its outcome.",
    )
    drawn = [run for run in runs if run.has("forecast/generation_time")]
    for run in runs:
        if run not in drawn:
            section.notes.append(
                f"{run.name}: no `forecast/*` metrics (recorded since the unified cost model)"
            )
    if drawn:
        section.images.append(image(out, "forecast", figures.forecast(drawn), "forecast vs actual per step"))
    rows = [
        [run.name, score.label, str(score.steps), f"{score.within:.0%}", f"{100 * score.mean_abs_error:.1f}%"]
        for run in drawn
        for score in forecast_scores(run)
    ]
    if rows:
        header = ["run", "forecast", "steps", f"within {FORECAST_GOAL:.0%}", "mean |error|"]
        section.html.append(table(header, rows))
    whole, pilots = [], []
    for run in runs:
        outcome = run_outcome(run)
        if run.forecast is None or outcome is None:
            continue
        f = run.forecast
        if "pilot/seconds" in f:
            sampled = f" sampled {f['pilot/prompts']:.0f} prompt(s) and" if "pilot/prompts" in f else ""
            pilots.append(
                f"{run.name}: the length pilot before step 1{sampled} took {f['pilot/seconds']:.1f} s"
                + (f", ${f['pilot/cost']:.4g} of the learner's slot" if "pilot/cost" in f else "")
                + " (in no step's time or cost, nor in the whole run's figures)"
            )
        if "warning" in f:
            pilots.append(f"{run.name}: before the run: {f['warning']}")
        if "validation/seconds" in f:
            measured = [v["time/validation"] for v in run.validations.values() if "time/validation" in v]
            pilots.append(
                f"{run.name}: {f['validation/count']:.0f} validation(s) forecast at "
                f"{f['validation/seconds']:.1f} s, ${f['validation/cost']:.4g} (apart from the steps'); "
                + (f"{len(measured)} took {sum(measured):.1f} s" if measured else "none measured")
            )
        for name, key, unit in (("time", "time_s", " s"), ("cost", "cost", " $")):
            if key not in outcome:
                continue
            lo, hi = f.get(f"{name}_range" if name == "cost" else "time_range_s", [None, None])
            whole.append(
                [
                    run.name,
                    name,
                    f"{f[key]:.4g}{unit}",
                    f"{fmt(lo, '.4g')} - {fmt(hi, '.4g')}",
                    f"{outcome[key]:.4g}{unit}",
                    f"{100 * (f[key] / outcome[key] - 1):+.1f}%",
                ]
            )
    if whole:
        header = ["run", "whole run", "forecast", "range", "actual", "forecast error"]
        section.html.append(table(header, whole))
    section.html.extend(f"<p>{escape(line)}</p>" for line in pilots)
    return section


FLOOR_KEYS = (
    "time/generation",
    "floor/generation_s",
    "floor/time_over",
    "floor/cost_over",
    "prefill/tree_ratio",
    "time/prep_overlapped",
)


def floor_section(runs: list[Run]) -> Section:
    section = Section(
        "floor",
        "Generation over its floor",
        "The floor of each step's true lengths on the profile its plan used: no schedule generates "
        "faster (the longest sequence alone, or every token at the best batch on every actor) or "
        "more cheaply (every token at the best batch). Prompt tokens computed over the step's "
        "unique ones (its prefix tree: 1.0 at best), and preparation run in generation's tail. "
        "Means over the run's steps.",
    )
    rows = []
    for run in runs:
        steps = [m for m in run.metrics.values() if "floor/generation_s" in m]
        if not steps:
            section.notes.append(f"{run.name}: no `floor/*` metrics (recorded since the floor was added)")
            continue
        mean = {k: float(np.mean([m.get(k, np.nan) for m in steps])) for k in FLOOR_KEYS}
        rows.append(
            [
                run.name,
                seconds(mean["time/generation"]),
                seconds(mean["floor/generation_s"]),
                f"{mean['floor/time_over']:.2f}x",
                "-" if np.isnan(mean["floor/cost_over"]) else f"{mean['floor/cost_over']:.2f}x",
                "-" if np.isnan(mean["prefill/tree_ratio"]) else f"{mean['prefill/tree_ratio']:.2f}",
                "-" if np.isnan(mean["time/prep_overlapped"]) else seconds(mean["time/prep_overlapped"]),
            ]
        )
    if rows:
        head = ["run", "generation", "floor", "time / floor", "cost / work floor"]
        section.html.append(table([*head, "prompt tokens / unique", "preparation in the tail"], rows))
    return section


def scaling_section(runs: list[Run], out: Path) -> Section:
    section = Section(
        "scaling",
        "Scaling decisions",
        "Per step: the planner's candidate table (N decode actors, predicted time, predicted cost, score; "
        "lower score wins), the chosen N, and predicted vs actual generation time and cost.",
    )
    for i, run in enumerate(runs):
        if not run.plans:
            section.notes.append(f"{run.name}: no plans/step_*.json files (no planner in this run)")
            continue
        fig = figures.scaling(run)
        section.images.append(image(out, f"scaling-{i}", fig, f"{run.name}: scaling decision per step"))
        steps = sorted(run.plans)
        section.html.append(f"<h3>{escape(run.name)}: last step</h3>" + candidate_table(run, steps[-1]))
        shown = steps[-TABLE_STEPS:]
        tables = "".join(candidate_table(run, s) for s in shown)
        section.html.append(
            f"<details><summary>{escape(run.name)}: candidate tables of the last {len(shown)} step(s)"
            f"</summary>{tables}</details>"
        )
    return section
