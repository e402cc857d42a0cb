"""Injected faults: which function dies, slows down or takes its node with it, at which step and
point; or the driver, half-way through a checkpoint write.

A fault is (kind, target, when): `runtime.faults` lists them, `runtime.fault_schedule` draws them
at random per step from a seed. Both are pure functions of the config and the step number, so a
faulty run meets the same faults every time, and a run resumed after a kill meets them again:
its samples can be compared token for token with an undisturbed run of the same seed. Reruns of
a dead function are never armed, so every fault is survivable. It sits beside `runtime_config.py`,
which validates the raw mappings through `parse_faults`, so the config imports no runtime module.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil

# kind -> (keys it takes beyond kind and step, what it does)
KINDS: dict[str, tuple[tuple[str, ...], str]] = {
    "decode_exit": (("actor", "after"), "decode function `actor` exits (os._exit) after `after` iterations"),
    "slow": (
        ("actor", "after", "seconds"),
        "decode function `actor` sleeps `seconds` after `after` iterations",
    ),
    "node_exit": (
        ("node", "after"),
        "the first decode function on plan node `node` (>= 1, never the driver's) kills its node's "
        "raylet, then exits, after `after` iterations",
    ),
    "prepare_exit": ((), "the prepare (reward/reference) function exits before it scores"),
    "prepare_slow": (("seconds",), "the prepare function sleeps `seconds` before it scores"),
    "checkpoint_exit": (
        ("file",),
        "the driver exits (os._exit(137), as a kill -9 would leave it) in step `step`'s checkpoint "
        "write, right after writing `file`",
    ),
}
# What a seeded schedule draws by default: faults of the functions, which a run survives on its own.
SCHEDULED = ("decode_exit", "slow", "prepare_exit", "prepare_slow")
# What it may draw: a node's loss too (plan node 1; none on a one-node cluster, where it never fires).
SCHEDULABLE = (*SCHEDULED, "node_exit")
CHECKPOINT_FILES = ("model.safetensors", "optimizer.pt", "rng.json", "trainer_state.json")
# A decode function named by its role instead of its plan index: the one on the learner's slot
# (or GPUs), or the first elsewhere. Placement decides which plan index each has, so a test that
# means one of them says so, and still means it when the placement rule changes.
ROLES = ("colocated", "remote")
EXIT_CODE = 137  # what a shell reports for a process killed with -9


@dataclass(frozen=True)
class Fault:
    """One injected fault; which keys matter depends on `kind` (see `KINDS`)."""

    kind: str
    step: int
    actor: int | str = 0  # plan index of the decode function (modulo the plan's size), or a role
    node: int = 1  # plan node index (node_exit)
    after: int = 1  # decode iterations of this step before it fires
    seconds: float = 1.0  # slow, prepare_slow
    file: str = "optimizer.pt"  # checkpoint_exit


@dataclass(frozen=True)
class FaultSchedule:
    """At each step, with probability `rate`, one fault of a kind drawn from `kinds`."""

    seed: int = 0
    rate: float = 0.0
    kinds: tuple[str, ...] = SCHEDULED
    max_after: int = 8
    max_seconds: float = 2.0

    def at(self, step: int) -> list[Fault]:
        rng = np.random.default_rng([self.seed, step])
        if self.rate <= 0 or rng.random() >= self.rate:
            return []
        kind = self.kinds[int(rng.integers(len(self.kinds)))]
        actor, after = int(rng.integers(0, 1 << 16)), int(rng.integers(1, self.max_after + 1))
        seconds = round(float(rng.uniform(0.1, self.max_seconds)), 3)
        return [Fault(kind, step, actor=actor, after=after, seconds=seconds)]


@dataclass(frozen=True)
class DecodeFault:
    """What one decode function is armed with: at iteration `after`, sleep or die (with its node)."""

    kind: str
    after: int
    seconds: float = 0.0

    def fire(self) -> None:
        """Runs inside the function. A process that dies here sends no report: the controller
        sees it lost, as it would a crash."""
        if self.kind == "slow":
            time.sleep(self.seconds)
            return
        if self.kind == "node_exit":
            parent = psutil.Process(os.getppid())
            if parent.name().startswith("raylet"):  # a Ray worker's parent is its node's raylet
                os.kill(parent.pid, signal.SIGKILL)
        os._exit(1)


@dataclass(frozen=True)
class FaultPlan:
    """Every fault of a run, listed and scheduled; asked per step by the runtime."""

    listed: tuple[Fault, ...] = ()
    schedule: FaultSchedule | None = None

    def at(self, step: int) -> list[Fault]:
        drawn = self.schedule.at(step) if self.schedule else []
        return [f for f in self.listed if f.step == step] + drawn

    def __bool__(self) -> bool:
        return bool(self.listed) or (self.schedule is not None and self.schedule.rate > 0)

    def decode(
        self, step: int, actors: list[tuple[int, int, bool]], driver_node: int | None
    ) -> dict[int, list[DecodeFault]]:
        """Faults of step `step`'s decode functions by plan actor; `actors` is (actor, plan node,
        colocated with the learner) in plan order. A role goes to the first function that has it,
        if any; a node fault to the first function on its node, never the driver's."""
        armed: dict[int, list[DecodeFault]] = {}
        for f in self.at(step):
            if f.kind in ("decode_exit", "slow") and actors:
                actor = _target(f.actor, actors)
                seconds = f.seconds if f.kind == "slow" else 0.0
                if actor is not None:
                    armed.setdefault(actor, []).append(DecodeFault(f.kind, f.after, seconds))
            elif f.kind == "node_exit" and f.node != driver_node:
                on_node = [a for a, node, _ in actors if node == f.node]
                if on_node:
                    armed.setdefault(on_node[0], []).append(DecodeFault(f.kind, f.after))
        return armed

    def prepare(self, step: int) -> tuple[bool, float]:
        """(exit, seconds to sleep first) for step `step`'s prepare function."""
        faults = self.at(step)
        slow = sum(f.seconds for f in faults if f.kind == "prepare_slow")
        return any(f.kind == "prepare_exit" for f in faults), slow

    def checkpoint_file(self, step: int) -> str | None:
        """The file after which step `step`'s checkpoint write exits the driver, if any."""
        return next((f.file for f in self.at(step) if f.kind == "checkpoint_exit"), None)


def _target(actor: int | str, actors: list[tuple[int, int, bool]]) -> int | None:
    """The plan actor a decode fault names: by index (modulo the plan's size) or by role."""
    if isinstance(actor, int):
        return actors[actor % len(actors)][0]
    return next((a for a, _, colocated in actors if colocated == (actor == "colocated")), None)


def exit_after(file: str | None) -> Callable[[str], None]:
    """A checkpoint writer's `on_file` hook that exits the process right after it wrote `file`."""

    def hook(name: str) -> None:
        if name == file:
            os._exit(EXIT_CODE)

    return hook


# ----- parsing the config's mappings -----------------------------------------------------------


def _int(where: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{where}: got {value!r}, expected an integer >= {low}")
    return value


def _seconds(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 3600:
        raise ValueError(f"{where}: got {value!r}, expected seconds in [0, 3600]")
    return float(value)


def _kind(where: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{where}: got {value!r}, expected one of {', '.join(allowed)}")
    return value


def _mapping(where: str, raw: Any, allowed: tuple[str, ...]) -> dict:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: got {raw!r}, expected a mapping")
    extra = [k for k in raw if k not in allowed]
    if extra:
        raise ValueError(f"{where}.{extra[0]}: unknown key, expected one of {', '.join(allowed)}")
    return raw


def parse_fault(raw: Any, where: str) -> Fault:
    """One `runtime.faults` entry, e.g. {kind: decode_exit, step: 2, actor: 0, after: 3}."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: got {raw!r}, expected a mapping with kind and step")
    kind = _kind(f"{where}.kind", raw.get("kind"), tuple(KINDS))
    keys = KINDS[kind][0]
    raw = _mapping(where, raw, ("kind", "step", *keys))
    if "step" not in raw:
        raise ValueError(f"{where}.step: missing, expected the step (an integer >= 1) it fires in")
    values: dict[str, Any] = {"step": _int(f"{where}.step", raw["step"], 1)}
    for key in keys:
        if key not in raw:
            continue
        value, at = raw[key], f"{where}.{key}"
        if key == "seconds":
            values[key] = _seconds(at, value)
        elif key == "file":
            values[key] = _kind(at, value, CHECKPOINT_FILES)
        elif key == "actor" and isinstance(value, str):
            values[key] = _kind(at, value, ROLES)
        else:
            values[key] = _int(at, value, {"actor": 0, "node": 1, "after": 1}[key])
    return Fault(kind, **values)


def parse_schedule(raw: Any, where: str) -> FaultSchedule | None:
    """`runtime.fault_schedule`, e.g. {seed: 0, rate: 0.2, kinds: [decode_exit, slow]}; {} = none."""
    if raw is None or raw == {}:
        return None
    names = ("seed", "rate", "kinds", "max_after", "max_seconds")
    raw = _mapping(where, raw, names)
    rate = raw.get("rate", 0.0)
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1:
        raise ValueError(f"{where}.rate: got {rate!r}, expected a probability per step in [0, 1]")
    kinds = raw.get("kinds", list(SCHEDULED))
    if not isinstance(kinds, list | tuple) or not kinds:
        raise ValueError(
            f"{where}.kinds: got {kinds!r}, expected a non-empty list of {', '.join(SCHEDULABLE)}"
        )
    return FaultSchedule(
        seed=_int(f"{where}.seed", raw.get("seed", 0), 0),
        rate=float(rate),
        kinds=tuple(_kind(f"{where}.kinds[{i}]", k, SCHEDULABLE) for i, k in enumerate(kinds)),
        max_after=_int(f"{where}.max_after", raw.get("max_after", 8), 1),
        max_seconds=_seconds(f"{where}.max_seconds", raw.get("max_seconds", 2.0)),
    )


def parse_faults(listed: Any, schedule: Any) -> FaultPlan:
    """`runtime.faults` and `runtime.fault_schedule` as one plan; a mistake names its key."""
    if not isinstance(listed, list | tuple):
        raise ValueError(f"faults: got {listed!r}, expected a list of mappings (kind, step, ...)")
    faults = tuple(parse_fault(raw, f"faults[{i}]") for i, raw in enumerate(listed))
    return FaultPlan(faults, parse_schedule(schedule, "fault_schedule"))


def describe() -> str:
    """The kinds and their keys, for the config's help text."""
    return "; ".join(f"{k} ({', '.join(('step', *keys))}): {text}" for k, (keys, text) in KINDS.items())
