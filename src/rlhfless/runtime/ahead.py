"""Learning ahead: prompt groups learned on the learning phase's extra ranks during generation.

With a group-local estimator and one update a step (`returns.group_local`), a group's gradient
needs only its own samples, rewards and advantages. Once it is scored while stragglers decode,
a rank started early (`planner.learning.start_ranks_ahead`) takes the step's published weights
and computes that gradient (`Learner.learn_ahead`); the update then leaves the group out of the
ranks' shares and sums what was learned ahead with the rest. The update is the one it would have
been, within float rounding, and strictly on-policy: the weights are the step's own, which the
samples were drawn from.

This object is one step's bookkeeping on the driver: what was sent to which rank, what came
back, and, as the update starts, which samples count. A rank's ahead gradients count all or
none: they count only if its every call came back and every advantage it learned with equals the
one the update is given (the step loop computes them again, on the whole batch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ray
import torch
from ray.exceptions import RayTaskError
from torch import Tensor

from rlhfless.runtime.billing import Invocation
from rlhfless.runtime.lifecycle import LOST
from rlhfless.runtime.samples import Sample

Key = tuple[str, int]  # (uid, sample index)


@dataclass
class Call:
    """One group sent to a rank: what it learns with, and its forecast seconds."""

    rank: Any
    inv: Invocation
    advantages: dict[Key, Tensor]
    estimate_s: float


@dataclass
class StepAhead:
    """One step's groups learned ahead, by rank."""

    calls: dict[ray.ObjectRef, Call] = field(default_factory=dict)
    learned: dict[Any, dict[Key, Tensor]] = field(default_factory=dict)  # per rank, what came back
    failed: set = field(default_factory=set)  # ranks a call failed on: none of theirs counts
    sent: set[str] = field(default_factory=set)  # groups sent
    seconds: float = 0.0  # rank-seconds spent learning ahead

    def send(
        self,
        rank: Any,
        inv: Invocation,
        samples: list[Sample],
        advantages: list[Tensor],
        ref: list[Tensor] | None,
        estimate_s: float,
    ) -> None:
        """A scored group to `rank`, which holds the step's weights."""
        call = rank.ahead.remote(samples, advantages, ref)
        keys = [s.key for s in samples]
        self.calls[call] = Call(rank, inv, dict(zip(keys, advantages, strict=True)), estimate_s)
        self.sent.add(samples[0].uid)

    def queued_s(self) -> float:
        """Forecast seconds of the calls under way."""
        return sum(call.estimate_s for call in self.calls.values())

    def poll(self) -> None:
        """Take in the calls that came back, without waiting."""
        if self.calls:
            done, _ = ray.wait(list(self.calls), num_returns=len(self.calls), timeout=0)
            for ref in done:
                self._absorb(ref)

    def settle(self, ranks: list[Any], samples: list[Sample], advantages: list[Tensor]) -> frozenset[Key]:
        """Every call back (waited for); the samples learned ahead that count in the update: those
        of the ranks still in the phase (`ranks`) whose calls all came back and whose every
        advantage equals the update's."""
        for ref in list(self.calls):
            self._absorb(ref)
        given = {s.key: a for s, a in zip(samples, advantages, strict=True)}
        counted: set[Key] = set()
        for rank in ranks:
            learned = self.learned.get(rank, {})
            if rank in self.failed or not all(torch.equal(given[k], a) for k, a in learned.items()):
                continue
            counted |= set(learned)
        return frozenset(counted)

    def _absorb(self, ref: ray.ObjectRef) -> None:
        call = self.calls.pop(ref)
        try:
            begin, end = ray.get(ref)
        except (*LOST, RayTaskError):
            self.failed.add(call.rank)
            return
        call.inv.mark_busy(begin, end)
        self.seconds += end - begin
        self.learned.setdefault(call.rank, {}).update(call.advantages)
