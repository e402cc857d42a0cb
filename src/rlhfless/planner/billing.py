"""How the executor starts and bills the step's functions, as the planner prices its plans: the
learner's resources, warm and handed-over functions, the rest of the step after generation and
its learning widths (`Billing`), and what a GPU handed back to the learner costs (`handback`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rlhfless.planner.pricing import Pricing, charge


@dataclass(frozen=True)
class LearningWidth:
    """One width the learning phase may take, as a budget or deadline weighs it against the
    others: the units its ranks hold, the phases' seconds a token at it (`after_per_token_s`), its
    wait for its ranks per N (`learner_wait_s`) and an extra rank's start (`rank_start_s`)."""

    width: int
    units: float
    per_token_s: float
    wait_s: tuple[float, ...] = ()
    rank_start_s: float = 0.0


@dataclass(frozen=True)
class Billing:
    """How the executor starts and bills the step's functions: the planner prices its plans so.

    The runtime's learner is a resident process holding `resident_units` all step, and functions
    start on demand at the step's start. Its function on the learner's resources (slot 0) is
    started before the run's first step and kept warm after it; the step waits only what is left
    of that start (`host_start_s`). The simulated learner holds every GPU to learn and hands them
    over (`handoff`): a decode function takes its GPUs from the learner with the new weights on
    them, as verl's workers do, so it starts with no cold start and no weights streamed; the learner
    takes every GPU back at generation's end, so a GPU released before then (or taken by no
    actor) idles until then or is stopped and restarted (a cold start, out of the step's time),
    whichever bills less (`pricing.keep_warm` at lam = 0). The GPUs it hands over are
    `after_units`. The rest of the step (preparation and learning) takes `after_fixed_s` plus
    `after_per_token_s` per predicted token on `after_units`, whatever N is (and bills
    `after_billed_per_token_s` there, where part of its work ran hidden during generation), and the learning
    phase's wait for its ranks, which depends on N (`learner_wait_s`): a budget or deadline is for
    the whole step, and a released function's next use is that far away unless
    `next_use_after` is False (the learner takes its resources: never).
    """

    pricing: Pricing
    resident_units: float = 0.0
    warm_actors: int = 0
    host_start_s: float = 0.0
    handoff: bool = False
    overhead_s: float = 0.0  # the executor's own seconds on every actor's time (learned: `Calibration`)
    time_margin: float = 0.0  # a deadline is met with this relative margin (learned: `Margins`)
    cost_margin: float = 0.0  # likewise a budget
    generation_shortfall: float = (
        1.0  # generation lately took this x its forecast: verl's cap / it (`Margins`)
    )
    # A split between sizes lately fell this much further short of its forecast than the best
    # single size would have (`replay.versus_single`): its generation forecast is stretched by
    # it where the sizes are weighed (`sizes.plan_shapes`).
    split_shortfall: float = 1.0
    after_units: float = 0.0
    after_fixed_s: float = 0.0
    after_per_token_s: float = 0.0
    # The rest of the step's bill, in seconds a token on `after_units`: more than its visible
    # seconds where preparation ran during generation on GPUs the decode actors freed (billed
    # there, hidden from the step's time). None: the visible seconds are the bill.
    after_billed_per_token_s: float | None = None
    next_use_after: bool = False
    # The learning phase's wait for its extra ranks at N = 1, 2, ... decode functions (the last
    # for any N past them; `forecast.LearnerWait`): none, the simulator's.
    learner_wait_s: tuple[float, ...] = ()
    # An extra rank's start, billed on its slot (`after_units` beyond `resident_units`) whether
    # the phase waits for it or not: what the phase does not wait for, it started during
    # generation. 0: ranks that live across steps (verl's resident ones), or the simulator's.
    rank_start_s: float = 0.0
    # The learning widths a budget or deadline chooses among with N (none: the phase's own choice,
    # which this billing's `after_*` figures stand for).
    widths: tuple[LearningWidth, ...] = ()

    def at_width(self, width: LearningWidth) -> Billing:
        """This billing with the rest of the step learned at `width`."""
        return replace(
            self,
            after_units=width.units,
            after_per_token_s=width.per_token_s,
            after_billed_per_token_s=None,
            learner_wait_s=width.wait_s,
            rank_start_s=width.rank_start_s,
            widths=(),
        )

    def after_generation(self, tokens: float, n: np.ndarray | None = None) -> tuple[Any, Any]:
        """(seconds, USD) of the rest of the step for `tokens` predicted prompt + response tokens;
        per candidate `n` where given, the learning phase's wait for its ranks at that N included,
        and the bill of their start before it."""
        seconds = self.after_fixed_s + self.after_per_token_s * tokens
        billed_rate = self.after_billed_per_token_s
        billed = seconds if billed_rate is None else self.after_fixed_s + billed_rate * tokens
        if n is None:
            return seconds, charge(self.pricing, self.after_units, billed)
        wait = self.rank_wait(n)
        early = np.maximum(self.rank_start_s - wait, 0.0)
        extra = max(self.after_units - self.resident_units, 0.0)
        cost = charge(self.pricing, self.after_units, billed + wait) + charge(self.pricing, extra, early)
        return seconds + wait, cost

    def rank_wait(self, n: Any) -> Any:
        """The learning phase's wait for its ranks after `n` decode functions (`learner_wait_s`)."""
        waits = np.asarray(self.learner_wait_s or (0.0,))
        return waits[np.minimum(n, waits.size) - 1]


def handback(pricing: Pricing, units: Any, idle_s: Any, warm: Any, cold_start_s: float) -> Any:
    """USD for `units` a decode function gives back to the learner `idle_s` before it needs them
    (`Billing.handoff`). Kept warm (`warm`) until then, but where keep-alive is billed for at most
    a cold start's seconds: past that it is stopped, and restarted before the learner needs it (a
    cold start). Not kept warm: stopped at once and restarted. The planner keeps warm only where
    its forecast idle is within a cold start (`pricing.keep_warm` at lam = 0), so its forecasts
    never pay both."""
    idle = np.asarray(idle_s, dtype=float)
    warm = np.asarray(warm, dtype=bool)
    over = warm & (idle > cold_start_s) & pricing.bill_keep_alive
    waited = np.where(warm & ~over, idle, np.where(over, cold_start_s, 0.0))
    restart = np.where(warm & ~over, 0.0, cold_start_s)
    return charge(pricing, units, restart, cold_s=restart, idle_s=waited)
