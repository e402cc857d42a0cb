"""The warm pool: released functions stay started for `keep_alive_s`, so the next step reuses them.

A lease is one started Ray actor. Acquiring reuses an idle lease of the same shape (kind,
colocation, node) when one is warm, else creates one (a cold start). Releasing returns the lease to
the pool, or stops it when the planner says a cold start later is cheaper than idling till then;
leases idle longer than the keep-alive are stopped. Dead leases are dropped. Idle time holds the
function's resources, so the pool keeps each idle span (`spans`) for the meter to bill.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray

Shape = tuple[str, bool, int]  # (kind, colocated with the learner, node index)


@dataclass(eq=False)
class Lease:
    """A started function; `version` is the weight version it holds (None: not synced yet)."""

    handle: Any
    shape: Shape
    serial: int
    cold: bool = True
    version: int | None = None
    idle_since: float = 0.0
    hello: Any = None  # ObjectRef of its `Started` record, while its cold start is being awaited
    where: Any = None  # ObjectRef of its node id: ready once Ray has placed it (its cold start runs on)
    units: float = 0.0  # billed accelerator units it holds (0: on the learner's resources)
    resources: dict[str, float] | None = None
    prestarted: float | None = None  # when it was started ahead of its first use (`prestart`)


@dataclass(frozen=True)
class IdleSpan:
    """A warm function idle in the pool from `start` to `end`, holding its resources."""

    lease: Lease
    start: float
    end: float


class FunctionPool:
    """Keeps idle functions warm for `keep_alive_s` seconds; `create(shape, after)` starts a new
    one (once the object `after` is ready, when given) and `stop(handle)` ends one."""

    def __init__(
        self,
        create: Callable[[Shape, Any], Any],
        keep_alive_s: float,
        stop: Callable[[Any], None] | None = None,
    ) -> None:
        self.create, self.keep_alive_s = create, keep_alive_s
        self.stop = stop or _kill
        self.idle: list[Lease] = []
        self.leased: set[Lease] = set()
        self.spans: list[IdleSpan] = []  # ended idle spans not yet taken by the meter
        # A pre-started function's whole start (pre-start to ready) by kind, once known; taken
        # by the step's metrics.
        self.prestart_s: dict[str, float] = {}
        self._serial = itertools.count()

    def acquire(self, shape: Shape, now: float) -> Lease:
        self.evict(now)
        for lease in self.idle:
            if lease.shape == shape:
                self.idle.remove(lease)
                self.spans.append(IdleSpan(lease, lease.idle_since, now))
                # Pre-started and still starting: cold, for what is left of its start.
                lease.cold = lease.hello is not None and not ray.wait([lease.hello], timeout=0)[0]
                if not lease.cold:
                    self._started_ahead(lease)
                    lease.hello = None
                self.leased.add(lease)
                return lease
        lease = self._start(shape)
        self.leased.add(lease)
        return lease

    def prestart(self, shape: Shape, now: float, after: Any = None) -> None:
        """Start a function before its first use, idle in the pool: a run's first step then finds
        it started (or waits only for the rest of its start). `after`: an object ref whose
        readiness its start waits for."""
        lease = self._start(shape, after)
        lease.idle_since = lease.prestarted = now
        self.idle.append(lease)

    def starting_s(self, shape: Shape, now: float) -> float | None:
        """How long the function of `shape` a step would take has been starting: since its
        pre-start while that still runs, 0 where there is none (a whole start ahead), None where
        one is started."""
        idle = [lease for lease in self.idle if lease.shape == shape]
        if not idle:
            return None if any(lease.shape == shape for lease in self.leased) else 0.0
        if any(lease.hello is None or ray.wait([lease.hello], timeout=0)[0] for lease in idle):
            return None
        return now - min(lease.idle_since for lease in idle)

    def _started_ahead(self, lease: Lease) -> None:
        """A warm lease's start, if it was pre-started and not yet measured (one that died while
        starting is found lost when it is used)."""
        if lease.hello is None or lease.prestarted is None:
            return
        try:
            self.started(lease, ray.get(lease.hello).ready)
        except ray.exceptions.RayError:
            pass

    def started(self, lease: Lease, ready: float) -> None:
        """A started lease's ready time: a pre-started one's whole start is kept by kind."""
        if lease.prestarted is not None:
            self.prestart_s[lease.shape[0]] = ready - lease.prestarted
            lease.prestarted = None

    def _start(self, shape: Shape, after: Any = None) -> Lease:
        handle = self.create(shape, after)
        where = handle.where.remote()  # submitted first: an actor runs one caller's calls in order
        return Lease(handle, shape, next(self._serial), hello=handle.hello.remote(), where=where)

    def release(self, lease: Lease, now: float, keep: bool = True) -> None:
        """Back to the pool, warm (`keep`), or stopped now."""
        self.leased.discard(lease)
        if not keep:
            self.stop(lease.handle)
            return
        lease.idle_since = now
        self.idle.append(lease)

    def stop_idle(self, leases: list[Lease], now: float) -> None:
        """Stop these idle leases now (their next use is further away than a cold start is worth)."""
        for lease in leases:
            self.idle.remove(lease)
            self.spans.append(IdleSpan(lease, lease.idle_since, now))
            self.stop(lease.handle)

    def take_spans(self, now: float) -> list[IdleSpan]:
        """Idle spans up to `now`: the ended ones (then forgotten) and the still idle ones so far."""
        ended, self.spans = self.spans, []
        return ended + [IdleSpan(lease, lease.idle_since, now) for lease in self.idle]

    def drop(self, lease: Lease) -> None:
        """Forget a lease whose process died (or stop it when it is still there)."""
        self.leased.discard(lease)
        self.stop(lease.handle)

    def evict(self, now: float) -> int:
        """Stop functions idle for longer than the keep-alive; returns how many."""
        expired = [lease for lease in self.idle if now - lease.idle_since > self.keep_alive_s]
        for lease in expired:  # the platform stopped it when its keep-alive ran out
            self.idle.remove(lease)
            self.spans.append(IdleSpan(lease, lease.idle_since, lease.idle_since + self.keep_alive_s))
            self.stop(lease.handle)
        return len(expired)

    def close(self) -> None:
        for lease in [*self.idle, *self.leased]:
            self.stop(lease.handle)
        self.idle, self.leased = [], set()


def _kill(handle: Any) -> None:
    try:
        ray.kill(handle)
    except Exception:  # already gone: nothing to stop
        pass
