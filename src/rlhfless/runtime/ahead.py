"""Learning ahead: prompt groups learned on the learning phase's extra ranks during generation.

With a group-local estimator and one update a step (`returns.group_local`), a group's gradient
needs only its own samples, rewards and advantages. Once it is scored while stragglers decode,
a rank started early (`planner.learning.start_ranks_ahead`) takes the step's published weights
and computes that gradient (`Learner.learn_ahead`); the update then leaves the group out of the
ranks' shares and sums what was learned ahead with the rest. The update is the one it would have
been, within float rounding, and strictly on-policy: the weights are the step's own, which the
samples were drawn from.

`LearnsAhead` is the elastic learner's side of it: which rank learns ahead, what it has queued,
and what counts. `StepAhead` is one step's bookkeeping on the driver: what was sent to which
rank, what came back, and, as the update starts, which samples count. A rank's ahead gradients
count all or none: they count only if its every call came back and every advantage it learned
with equals the one the update is given (the step loop computes them again, on the whole batch).
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
from rlhfless.runtime.micro_batch import tokens_run
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


class LearnsAhead:
    """`ElasticLearner`'s verbs for learning ahead: the phase's first extra rank, requested early,
    learns scored groups until the phase opens, and the update counts what it learned. Uses the
    learner's phase state: its ranks and their invocations, `opened`, `serverful`, `group`, the
    measured `token_s` and `rank_start_s`, this step's `step_ahead`, and `_weigh`."""

    def group_s(self, samples: list[Sample]) -> float | None:
        """Forecast seconds of one rank learning this group (None before a phase was measured)."""
        return None if self.token_s is None else self.token_s * tokens_run(samples)

    def ahead_rank(self) -> tuple[Any, Invocation] | None:
        """The phase's first extra rank, once requested, until the phase opens: it learns ahead."""
        if self.opened or self.serverful or self.group is None or len(self.ranks) < 2:
            return None
        return self.ranks[1], self.invocations[0]

    def queued_s(self, now: float) -> float:
        """What the ahead rank has to do before a new call: the rest of its start, as last
        measured, and its calls under way, as forecast."""
        _, inv = self.ahead_rank()
        return max(0.0, inv.requested + (self.rank_start_s or 0.0) - now) + self.step_ahead.queued_s()

    def learn_ahead(
        self,
        weights: ray.ObjectRef,
        samples: list[Sample],
        advantages: list[Tensor],
        ref: list[Tensor] | None,
    ) -> None:
        """A scored group's gradients, on the ahead rank, with the step's published `weights`."""
        rank, inv = self.ahead_rank()
        estimate = self.group_s(samples) or 0.0
        self._weigh(rank, weights)
        self.step_ahead.send(rank, inv, samples, advantages, ref, estimate)

    def _ahead(self, samples: list[Sample], advantages: list[Tensor]) -> frozenset[Key]:
        """The samples learned ahead that count in this update (`StepAhead.settle`)."""
        self.phase_tokens = tokens_run(samples)
        counted = self.step_ahead.settle(self.ranks[1:], samples, advantages)
        self.phase |= {
            "learn/ahead_groups": float(len({uid for uid, _ in counted})),
            "time/learn_ahead": self.step_ahead.seconds,
        }
        return counted
