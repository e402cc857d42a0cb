"""Read a recorded run directory (docs/RUN_DIR.md) into plain, validated records.

Runs can be cut short (killed mid-write, resumed, run by an executor that records less), so every
reader here tolerates missing files, truncated lines and missing keys: whatever cannot be read is
skipped and described in `Run.problems`, and the figures draw from what is left.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

STEP_FILE = re.compile(r"^step_(\d+)\.(json|jsonl)$")


@dataclass(frozen=True)
class Event:
    """A moment inside a function's life: a cut, a migration out/in, a fault."""

    t: float
    kind: str
    n: int | None


@dataclass(frozen=True)
class Function:
    """One serverless function invocation in a step (seconds from step start)."""

    name: str
    kind: str
    resources: dict[str, float]
    requested: float | None
    started: float
    ready: float | None
    released: float
    busy: list[tuple[float, float]]
    events: list[Event]
    cost: float | None
    node: str | None = None  # the Ray node it ran on


@dataclass(frozen=True)
class Node:
    """A node the step was planned for: its slots then, and whether the driver (learner) ran there."""

    node: str
    address: str
    slots: int | None
    free: int | None
    driver: bool


@dataclass(frozen=True)
class Transfer:
    """One move of weights, prefix KV or sequence state to a function."""

    kind: str
    source: str
    target: str
    bytes: float
    seconds: float
    same_node: bool
    start: float | None


@dataclass(frozen=True)
class Timeline:
    step: int
    functions: list[Function]
    nodes: list[Node] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)
    has_nodes: bool = False  # the file records `nodes` (timelines before multi-node placement do not)


@dataclass(frozen=True)
class Candidate:
    """One row of the planner's candidate table."""

    n: int
    time: float
    cost: float
    score: float
    hidden: bool | None = None  # whether weight/KV transfer hides behind the first actor's work
    wait: float = 0.0  # the learning phase's forecast wait for its ranks at this N (verl's cap counts it)


@dataclass(frozen=True)
class Plan:
    step: int
    n_actors: int | None
    candidates: list[Candidate]
    plan_seconds: float | None
    policy: str | None
    time_cap: float | None = None  # verl's cap on generation time, where one was computed

    @property
    def chosen(self) -> Candidate | None:
        """The candidate row the planner picked (the one whose N is `n_actors`)."""
        return next((c for c in self.candidates if c.n == self.n_actors), None)


@dataclass(frozen=True)
class Sample:
    """One generated response of a rollout line."""

    uid: str
    sample: int
    response: str | None
    response_tokens: int | None
    predicted_length: float | None


@dataclass
class Run:
    """Everything the report draws from one run directory."""

    path: Path
    name: str
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    validations: dict[int, dict[str, float]] = field(default_factory=dict)  # validation.jsonl; step 0 too
    rollouts: dict[int, list[Sample]] = field(default_factory=dict)
    plans: dict[int, Plan] = field(default_factory=dict)
    timelines: dict[int, Timeline] = field(default_factory=dict)
    config_text: str | None = None
    forecast: dict | None = None  # forecast.json: the whole run's forecast made before step 1
    problems: list[str] = field(default_factory=list)

    @property
    def steps(self) -> list[int]:
        return sorted(self.metrics)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """Steps and values of one metric, skipping steps that did not record it."""
        steps = [s for s in self.steps if key in self.metrics[s]]
        return steps, [self.metrics[s][key] for s in steps]

    def held_out(self, key: str) -> tuple[list[int], list[float]]:
        """Steps and values of one validation metric (`validation.jsonl`), where recorded."""
        steps = sorted(s for s, v in self.validations.items() if key in v)
        return steps, [self.validations[s][key] for s in steps]

    def has(self, key: str) -> bool:
        return any(key in m for m in self.metrics.values())


def _number(value: object) -> float | None:
    """A finite float, or None for anything else (null, NaN, strings, booleans)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _int(value: object) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number == int(number) else None


def _json_lines(path: Path, problems: list[str]) -> Iterator[dict]:
    """Objects of a .jsonl file; a line that does not parse (a truncated write) is reported."""
    text = path.read_text(encoding="utf-8", errors="replace")
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            problems.append(f"{path.name} line {number} is not valid JSON (truncated write?); skipped")
            continue
        if isinstance(obj, dict):
            yield obj
        else:
            problems.append(f"{path.name} line {number} is not a JSON object; skipped")


def _json_file(path: Path, problems: list[str]) -> dict | None:
    try:
        obj = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError:
        problems.append(f"{path.parent.name}/{path.name} is not valid JSON (truncated write?); skipped")
        return None
    if not isinstance(obj, dict):
        problems.append(f"{path.parent.name}/{path.name} is not a JSON object; skipped")
        return None
    return obj


def _step_files(folder: Path, suffix: str) -> Iterator[tuple[int, Path]]:
    if not folder.is_dir():
        return
    for path in sorted(folder.iterdir()):
        match = STEP_FILE.match(path.name)
        if match and match.group(2) == suffix:
            yield int(match.group(1)), path


def _read_metrics(path: Path, problems: list[str]) -> dict[int, dict[str, float]]:
    """Numeric metrics per step (`metrics.jsonl`, `validation.jsonl`); a step logged twice (a
    resumed run) keeps its last record."""
    metrics: dict[int, dict[str, float]] = {}
    for obj in _json_lines(path, problems):
        step = _int(obj.get("step"))
        if step is None:
            problems.append(f"{path.name} has a record without an integer `step`; skipped")
            continue
        metrics[step] = {k: v for k, v in ((k, _number(v)) for k, v in obj.items()) if v is not None}
    return metrics


def _read_rollout(step: int, path: Path, problems: list[str]) -> list[Sample]:
    samples = []
    for obj in _json_lines(path, problems):
        index = _int(obj.get("sample"))
        if obj.get("uid") is None or index is None:
            problems.append(f"rollouts/{path.name} has a line without `uid` or `sample`; skipped")
            continue
        response = obj.get("response")
        samples.append(
            Sample(
                uid=str(obj["uid"]),
                sample=index,
                response=response if isinstance(response, str) else None,
                response_tokens=_int(obj.get("response_tokens")),
                predicted_length=_number(obj.get("predicted_length")),
            )
        )
    return samples


def _read_plan(step: int, obj: dict) -> Plan:
    candidates = []
    raw = obj.get("candidates")
    for row in raw if isinstance(raw, list) else []:
        if not isinstance(row, dict):
            continue
        n, values = _int(row.get("n")), [_number(row.get(k)) for k in ("time", "cost", "score")]
        hidden = row.get("hidden")
        if n is not None and None not in values:
            hidden = hidden if isinstance(hidden, bool) else None
            candidates.append(Candidate(n, *values, hidden=hidden, wait=_number(row.get("wait")) or 0.0))
    policy = obj.get("policy")
    return Plan(
        step=step,
        n_actors=_int(obj.get("n_actors")),
        candidates=sorted(candidates, key=lambda c: c.n),
        plan_seconds=_number(obj.get("plan_seconds")),
        policy=policy if isinstance(policy, str) else None,
        time_cap=_number(obj.get("time_cap")),
    )


def _read_function(raw: object) -> Function | None:
    """A timeline function, or None when it lacks the times needed to draw its bar."""
    if not isinstance(raw, dict):
        return None
    started, released = _number(raw.get("started")), _number(raw.get("released"))
    if started is None or released is None or released < started:
        return None
    busy = []
    for span in raw.get("busy") or []:
        if isinstance(span, list | tuple) and len(span) == 2:
            a, b = _number(span[0]), _number(span[1])
            if a is not None and b is not None and b >= a:
                busy.append((a, b))
    events = []
    for event in raw.get("events") or []:
        if isinstance(event, dict) and _number(event.get("t")) is not None:
            events.append(Event(_number(event["t"]), str(event.get("kind", "?")), _int(event.get("n"))))
    resources = raw.get("resources") if isinstance(raw.get("resources"), dict) else {}
    return Function(
        name=str(raw.get("name", "?")),
        kind=str(raw.get("kind", "?")),
        resources={k: v for k, v in ((str(k), _number(v)) for k, v in resources.items()) if v is not None},
        requested=_number(raw.get("requested")),
        started=started,
        ready=_number(raw.get("ready")),
        released=released,
        busy=busy,
        events=events,
        cost=_number(raw.get("cost")),
        node=raw["node"] if isinstance(raw.get("node"), str) else None,
    )


def _read_node(raw: object) -> Node | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("node"), str):
        return None
    return Node(
        node=raw["node"],
        address=str(raw.get("address", "")),
        slots=_int(raw.get("slots")),
        free=_int(raw.get("free")),
        driver=raw.get("driver") is True,
    )


def _read_transfer(raw: object) -> Transfer | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("same_node"), bool):
        return None
    nbytes, seconds = _number(raw.get("bytes")), _number(raw.get("seconds"))
    if nbytes is None or seconds is None:
        return None
    return Transfer(
        kind=str(raw.get("kind", "?")),
        source=str(raw.get("source", "?")),
        target=str(raw.get("target", "?")),
        bytes=nbytes,
        seconds=seconds,
        same_node=raw["same_node"],
        start=_number(raw.get("start")),
    )


def _records(step: int, obj: dict, key: str, read, problems: list[str]) -> list:
    """The readable records of list `key`; how many were not is reported."""
    raw = obj.get(key)
    raw = raw if isinstance(raw, list) else []
    records = [r for r in map(read, raw) if r is not None]
    if len(records) < len(raw):
        problems.append(
            f"timeline step {step}: {len(raw) - len(records)} unreadable `{key}` record(s); skipped"
        )
    return records


def _read_timeline(step: int, obj: dict, problems: list[str]) -> Timeline:
    raw = obj.get("functions")
    raw = raw if isinstance(raw, list) else []
    functions = [f for f in map(_read_function, raw) if f is not None]
    if len(functions) < len(raw):
        problems.append(
            f"timeline step {step}: {len(raw) - len(functions)} function(s) without valid "
            "`started`/`released` times; not drawn"
        )
    nodes = _records(step, obj, "nodes", _read_node, problems)
    transfers = _records(step, obj, "transfers", _read_transfer, problems)
    return Timeline(step, functions, nodes, transfers, has_nodes=isinstance(obj.get("nodes"), list))


def run_names(paths: list[Path]) -> list[str]:
    """Short, distinct labels for the runs (directory names, numbered when they repeat)."""
    names: list[str] = []
    for path in paths:
        base = path.resolve().name or str(path)
        name, k = base, 2
        while name in names:
            name, k = f"{base}#{k}", k + 1
        names.append(name)
    return names


def load_run(path: Path, name: str | None = None) -> Run:
    """Read what exists of a run directory; never raises for missing or damaged files."""
    run = Run(path=path, name=name or path.resolve().name)
    if not path.is_dir():
        run.problems.append(f"{path} is not a directory")
        return run
    metrics = path / "metrics.jsonl"
    if metrics.is_file():
        run.metrics = _read_metrics(metrics, run.problems)
    else:
        run.problems.append("no metrics.jsonl")
    if (path / "validation.jsonl").is_file():
        run.validations = _read_metrics(path / "validation.jsonl", run.problems)
    config = path / "config.yaml"
    run.config_text = config.read_text(encoding="utf-8", errors="replace") if config.is_file() else None
    if (path / "forecast.json").is_file():
        run.forecast = _json_file(path / "forecast.json", run.problems)
    for step, file in _step_files(path / "rollouts", "jsonl"):
        run.rollouts[step] = _read_rollout(step, file, run.problems)
    for step, file in _step_files(path / "plans", "json"):
        if (obj := _json_file(file, run.problems)) is not None:
            run.plans[step] = _read_plan(step, obj)
    for step, file in _step_files(path / "timeline", "json"):
        if (obj := _json_file(file, run.problems)) is not None:
            run.timelines[step] = _read_timeline(step, obj, run.problems)
    return run
