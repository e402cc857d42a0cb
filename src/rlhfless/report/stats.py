"""Numbers the report derives from recorded runs: predictor accuracy and the cross-run comparison."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlhfless.planner.prediction_quality import prediction_quality
from rlhfless.report.rundir import Run, Sample, Timeline

WITHIN_TOKENS = 50
PHASES = (
    ("time/preparation", "preparation"),
    ("time/generation", "generation"),
    ("time/learning", "learning"),
)
# Wall-clock overheads around the phases; dedup and I/O are drawn once a run records them.
OVERHEADS = (
    ("time/plan", "planner"),
    ("time/dedup", "dedup"),
    ("time/weight_sync", "weight sync"),
    ("time/kv_transfer", "KV transfer"),
    ("time/io", "I/O"),
)
# Parts of a phase (already inside its bar), listed in the table only.
SUBPHASES = (
    ("time/prefill", "generation: prefill"),
    ("time/decode", "generation: decode"),
    ("time/reference", "preparation: reference"),
    ("time/reward", "preparation: reward"),
)


def group_lengths(samples: list[Sample]) -> tuple[np.ndarray, np.ndarray]:
    """Predicted and actual group max response length for each prompt that has both."""
    predicted: dict[str, float] = {}
    actual: dict[str, int] = {}
    for s in samples:
        if s.predicted_length is not None:
            predicted.setdefault(s.uid, s.predicted_length)
        if s.response_tokens is not None:
            actual[s.uid] = max(actual.get(s.uid, 0), s.response_tokens)
    uids = [u for u in actual if u in predicted]
    return np.array([predicted[u] for u in uids]), np.array([actual[u] for u in uids], dtype=float)


@dataclass(frozen=True)
class PredictorScore:
    """How well predicted group max lengths matched the generated ones."""

    groups: int
    within: float
    tau: float | None


def predictor_score(predicted: np.ndarray, actual: np.ndarray) -> PredictorScore | None:
    """The planner's own quality figures (same definitions as the trainer's `predictor/*` metrics)."""
    if len(actual) == 0:
        return None
    quality = prediction_quality(predicted, actual)
    tau = quality["kendall_tau"]
    return PredictorScore(len(actual), quality[f"within_{WITHIN_TOKENS}"], None if np.isnan(tau) else tau)


def mean_metric(run: Run, key: str) -> float | None:
    values = run.series(key)[1]
    return float(np.mean(values)) if values else None


@dataclass(frozen=True)
class Comparison:
    """One row of the cross-run table; ratios are relative to the first run."""

    name: str
    steps: int
    mean_step_time: float | None
    mean_step_cost: float | None
    speedup: float | None
    cost_reduction: float | None
    samples: str


def _responses(run: Run) -> dict[tuple[int, str, int], str | None]:
    return {(step, s.uid, s.sample): s.response for step, rows in run.rollouts.items() for s in rows}


def samples_verdict(reference: Run, run: Run) -> str:
    """Whether two runs generated the same response text for every (step, uid, sample) both recorded."""
    if not reference.rollouts or not run.rollouts:
        return "no rollouts to compare"
    ours, theirs = _responses(reference), _responses(run)
    common = sorted(ours.keys() & theirs.keys())
    if not common:
        return "no common (step, uid, sample)"
    differ = sum(ours[k] != theirs[k] for k in common)
    if differ == 0:
        return f"identical ({len(common)} samples)"
    return f"differ in {differ} of {len(common)} samples"


def compare_runs(runs: list[Run]) -> list[Comparison]:
    """Mean step time and cost per run, speedup and cost reduction against the first run."""
    first = runs[0]
    base_time, base_cost = mean_metric(first, "time/step"), mean_metric(first, "cost/step")
    rows = []
    for i, run in enumerate(runs):
        time, cost = mean_metric(run, "time/step"), mean_metric(run, "cost/step")
        rows.append(
            Comparison(
                name=run.name,
                steps=len(run.metrics),
                mean_step_time=time,
                mean_step_cost=cost,
                speedup=base_time / time if base_time and time else None,
                cost_reduction=1 - cost / base_cost if base_cost and cost is not None else None,
                samples="reference" if i == 0 else samples_verdict(first, run),
            )
        )
    return rows


def _per_step(run: Run, key: str) -> list[float]:
    return [run.metrics[s].get(key, 0.0) for s in run.steps]


def planner_seconds(run: Run) -> list[float] | None:
    """Planning time per step: the logged `time/plan`, else the plan files' `plan_seconds`."""
    if run.has("time/plan"):
        return _per_step(run, "time/plan")
    if any(p.plan_seconds is not None for p in run.plans.values()):
        return [(run.plans[s].plan_seconds or 0.0) if s in run.plans else 0.0 for s in run.steps]
    return None


def phase_parts(run: Run) -> dict[str, list[float]]:
    """Seconds per step (aligned with `run.steps`, 0 where a step lacks it) of the stacked bars.

    The three phases always; then each overhead the run recorded. Overheads may overlap the phases
    (weight sync runs during learning's tail), so the stack can exceed the measured step time.
    """
    parts = {label: _per_step(run, key) for key, label in PHASES}
    for key, label in OVERHEADS:
        values = planner_seconds(run) if key == "time/plan" else _per_step(run, key) if run.has(key) else None
        if values is not None:
            parts[label] = values
    return parts


def subphase_parts(run: Run) -> dict[str, list[float]]:
    return {label: _per_step(run, key) for key, label in SUBPHASES if run.has(key)}


# Forecast against actual: (label, forecast metric, actual metric), as the trainer records them.
FORECASTS = (
    ("generation time (s)", "forecast/generation_time", "time/generation"),
    ("generation cost ($)", "forecast/generation_cost", "cost/generation"),
    ("step time (s)", "forecast/step_time", "time/step"),
    ("step cost ($)", "forecast/step_cost", "cost/step"),
)
FORECAST_GOAL = 0.20  # the share of steps whose forecast lands within 20% is reported


@dataclass(frozen=True)
class ForecastScore:
    """How one forecast series matched what happened, over the steps after the first."""

    label: str
    steps: int
    within: float  # share of steps within FORECAST_GOAL
    mean_abs_error: float


def forecast_scores(run: Run) -> list[ForecastScore]:
    """Per forecast series: its steps after the run's first, the share within 20%, the mean |error|."""
    out = []
    first = run.steps[0] if run.steps else None
    for label, key, actual in FORECASTS:
        errors = [
            m[key] / m[actual] - 1.0
            for s, m in run.metrics.items()
            if s != first and key in m and m.get(actual)
        ]
        if errors:
            err = np.abs(errors)
            out.append(
                ForecastScore(label, len(errors), float(np.mean(err <= FORECAST_GOAL)), float(err.mean()))
            )
    return out


def run_outcome(run: Run) -> dict[str, float] | None:
    """The whole run's actual time and cost over the steps its forecast covered."""
    if not run.forecast:
        return None
    steps = [r.get("step") for r in run.forecast.get("per_step", [])]
    rows = [run.metrics[s] for s in steps if s in run.metrics]
    if not rows or len(rows) != len(steps):
        return None
    out = {"time_s": float(sum(r.get("time/step", 0.0) for r in rows))}
    if all("cost/step" in r for r in rows):
        out["cost"] = float(sum(r["cost/step"] for r in rows))
    return out


@dataclass(frozen=True)
class TransferTotal:
    """Transfers of one kind that stayed inside a node or crossed between nodes, over some steps."""

    kind: str
    same_node: bool
    count: int
    bytes: float
    seconds: float


def transfer_totals(timelines: list[Timeline]) -> list[TransferTotal]:
    """Each (kind, inside a node or across) with its count, bytes and seconds summed: kinds in the
    order they first moved, inside a node before across."""
    totals: dict[tuple[str, bool], list[float]] = {}
    for timeline in timelines:
        for t in timeline.transfers:
            row = totals.setdefault((t.kind, t.same_node), [0, 0.0, 0.0])
            row[0] += 1
            row[1] += t.bytes
            row[2] += t.seconds
    kinds = list(dict.fromkeys(kind for kind, _ in totals))
    order = sorted(totals, key=lambda key: (kinds.index(key[0]), not key[1]))
    return [TransferTotal(k, same, int(totals[k, same][0]), *totals[k, same][1:]) for k, same in order]


def node_labels(timeline: Timeline) -> dict[str, str]:
    """A short name for each node a step ran on: `n0` (the driver's), `n1`, ... in the step's
    planned order, then any node only its functions name, by the start of its id."""
    labels = {n.node: f"n{i}" for i, n in enumerate(timeline.nodes)}
    for f in timeline.functions:
        if f.node is not None and f.node not in labels:
            labels[f.node] = f.node[:8]
    return labels
