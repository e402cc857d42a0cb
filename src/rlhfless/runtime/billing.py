"""The billing meter: every function invocation's life, and what the step cost.

An invocation is billed from `started` (resources granted) to `released`, for the accelerator
units it holds (GPUs, or the CPU slot standing in for them), priced by the one pricing model
(`planner.pricing.charge`): its cold start (`started` to `ready`) as the platform bills it.
A warm function idle in the pool still holds its resources: the pool's idle spans come in as
`keep-alive` invocations, billed as keep-alive idle. Functions colocated with another (prefill,
the heaviest decode actor and the reference share the learner's resources) are recorded but billed
once, through their host. Times are wall-clock (`time.time()`) so that they compare across
processes; the timeline stores them as seconds from the step start.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from rlhfless.planner.pricing import Pricing, charge
from rlhfless.runtime.transfer import Transfer

KEEP_ALIVE = "keep-alive"  # the kind of a warm function's idle span in the pool


@dataclass
class Invocation:
    """One function invocation in one step."""

    name: str
    kind: str  # learner, prefill, decode, reference, reward, critic, keep-alive
    resources: dict[str, float]  # what the function holds, e.g. {"CPU": 1} or {"GPU": 1}
    units: float  # billed accelerator units (GPUs, or the CPU slot standing in for them)
    requested: float
    started: float | None = None
    ready: float | None = None
    released: float | None = None
    colocated_with: str | None = None  # billed through this host instead of on its own
    cold: bool = False
    node: str | None = None  # the Ray node it ran on
    phase: str | None = None  # the phase whose cost it all is (a learner rank started early); None: by time
    busy: list[list[float]] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)

    def mark_busy(self, start: float, end: float) -> None:
        """Add a busy interval, merging it with the last one when they touch."""
        if self.busy and start - self.busy[-1][1] < 1e-3:
            self.busy[-1][1] = max(self.busy[-1][1], end)
        else:
            self.busy.append([start, end])

    @contextmanager
    def busy_while(self) -> Iterator[None]:
        """Busy for as long as the `with` body runs (metering written once)."""
        start = time.time()
        try:
            yield
        finally:
            self.mark_busy(start, time.time())

    def event(self, t: float, kind: str, n: int) -> None:
        self.events.append({"t": t, "kind": kind, "n": n})

    @property
    def billed(self) -> bool:
        return self.colocated_with is None and self.started is not None

    def alive(self, lo: float, hi: float) -> float:
        """Seconds of [started, released] inside [lo, hi]."""
        if self.started is None or self.released is None:
            return 0.0
        return max(0.0, min(hi, self.released) - max(lo, self.started))

    def starting(self, lo: float, hi: float) -> float:
        """Seconds of its cold start [started, ready] inside [lo, hi]."""
        if not self.cold or self.started is None or self.ready is None:
            return 0.0
        return max(0.0, min(hi, self.ready) - max(lo, self.started))


@dataclass
class Meter:
    """Collects one step's invocations and phase boundaries, then prices them."""

    pricing: Pricing
    origin: float = 0.0
    phases: list[tuple[str, float]] = field(default_factory=list)  # (phase, start time)
    invocations: list[Invocation] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)

    def begin_step(self, now: float) -> None:
        self.origin = now
        self.phases = [("generation", now)]
        self.invocations = []
        self.transfers = []

    def phase(self, name: str, now: float) -> None:
        self.phases.append((name, now))

    def open(self, inv: Invocation) -> Invocation:
        self.invocations.append(inv)
        return inv

    def cold_start_s(self) -> float | None:
        """The longest cold start (request to ready) of the step's functions so far; None before
        any: what a function's start takes on this machine, before a run has measured a rank's."""
        return max(
            (inv.ready - inv.requested for inv in self.invocations if inv.cold and inv.ready), default=None
        )

    def transfer(self, record: Transfer) -> None:
        self.transfers.append(record)

    def keep_alive(
        self,
        name: str,
        units: float,
        resources: dict[str, float],
        start: float,
        end: float,
        node: str | None = None,
    ) -> None:
        """A warm function's idle span in the pool (clipped to the step when it closes)."""
        if units > 0 and end > start:
            inv = Invocation(name, KEEP_ALIVE, resources, units, start, start, start, end, node=node)
            self.invocations.append(inv)

    def cost(self, inv: Invocation, lo: float, hi: float) -> float:
        if not inv.billed:
            return 0.0
        alive = inv.alive(lo, hi)
        if inv.kind == KEEP_ALIVE:
            return charge(self.pricing, inv.units, 0.0, idle_s=alive)
        return charge(self.pricing, inv.units, alive, cold_s=inv.starting(lo, hi))

    def close_step(self, end: float) -> tuple[dict[str, float], list[dict]]:
        """Release what is still held, price everything; returns metrics and timeline records."""
        for inv in self.invocations:
            if inv.kind == KEEP_ALIVE:  # only its part inside this step is this step's
                inv.started = inv.requested = inv.ready = max(inv.started, self.origin)
                inv.released = max(inv.started, min(inv.released, end))
            if inv.started is None:  # never got resources: nothing held, nothing billed
                inv.started = inv.released = inv.requested
            if inv.ready is None:
                inv.ready = inv.started
            if inv.released is None:
                inv.released = end
        bounds = [t for _, t in self.phases[1:]] + [end]
        timed = [inv for inv in self.invocations if inv.phase is None]
        phase_cost = {
            name: sum(self.cost(inv, start, stop) for inv in timed)
            for (name, start), stop in zip(self.phases, bounds, strict=True)
        }
        for inv in self.invocations:
            if inv.phase is not None:
                phase_cost[inv.phase] = phase_cost.get(inv.phase, 0.0) + self.cost(inv, self.origin, end)
        step_cost = sum(self.cost(inv, self.origin, end) for inv in self.invocations)
        records = [self._record(inv, end) for inv in self.invocations]
        moved = {True: 0.0, False: 0.0}
        for t in self.transfers:
            moved[t.same_node] += t.bytes
        decode = [inv for inv in self.invocations if inv.kind == "decode"]
        billed = [inv for inv in self.invocations if inv.billed and inv.kind != KEEP_ALIVE]
        warm = [inv for inv in self.invocations if inv.billed and inv.kind == KEEP_ALIVE]
        metrics = {
            "cost/step": step_cost,
            **{f"cost/{name}": value for name, value in phase_cost.items()},
            "actors/decode": float(len({inv.name for inv in decode})),
            "actors/cold_starts": float(sum(inv.cold for inv in self.invocations)),
            "time/cold_start": sum(inv.ready - inv.started for inv in self.invocations if inv.cold),
            "time/decode_cold_start": max(
                (inv.ready - inv.started for inv in decode if inv.cold), default=0.0
            ),
            "time/idle": sum(inv.alive(self.origin, end) - _busy(inv) for inv in billed),
            "time/billed": sum(inv.units * inv.alive(self.origin, end) for inv in billed),
            "time/keep_alive": sum(inv.units * inv.alive(self.origin, end) for inv in warm),
            "cost/keep_alive": sum(self.cost(inv, self.origin, end) for inv in warm),
            "bytes/within_node": moved[True],
            "bytes/across_nodes": moved[False],
        }
        return metrics, records

    def transfer_records(self) -> list[dict]:
        """The step's transfers for the timeline, times relative to the step start."""
        return [{**asdict(t), "start": round(t.start - self.origin, 4)} for t in self.transfers]

    def _record(self, inv: Invocation, end: float) -> dict:
        rel = lambda t: round(t - self.origin, 4)  # noqa: E731
        return {
            "name": inv.name,
            "kind": inv.kind,
            "resources": inv.resources,
            "units": inv.units,
            "requested": rel(inv.requested),
            "started": rel(inv.started),
            "ready": rel(inv.ready),
            "released": rel(inv.released),
            "busy": [[rel(a), rel(b)] for a, b in inv.busy],
            "events": [{**e, "t": rel(e["t"])} for e in inv.events],
            "cold": inv.cold,
            "colocated_with": inv.colocated_with,
            "node": inv.node,
            "cost": self.cost(inv, self.origin, end),
        }


def _busy(inv: Invocation) -> float:
    return sum(b - a for a, b in inv.busy)
