"""Forecast inputs learned from the run, and the forecast's error against what happened.

A profile measured with dummy batches, or derived from the model's shape, misses what a real step
adds: the engine's Python work per decode step, slicing, weight sync. `Calibration` learns two
numbers from every finished step and corrects the next plan's inputs (never its mechanisms):
- `decode_scale`: measured decode seconds over what the profile gives for the same sequences at
  their observed lengths (so a length misprediction does not bend the time model);
- `overhead_s`: the rest of the measured generation time, beyond the scaled model's.
`PhaseModel` learns the seconds of the phases after generation (preparation and learning) per
token. Both are EWMAs over steps, so they follow a run whose responses shrink.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from rlhfless.planner.profile import Profile
from rlhfless.planner.smoothing import ewma

ALPHA = 0.5  # weight of the newest step in every learned figure
# The share of a learning phase that more CPU ranks do not shorten (Amdahl): rank 0 alone steps
# the optimizer and the gradients are summed on it over gloo. Two ranks on two CPU slots took
# 0.70x one rank's time in session 23, 0.58x and 0.64x in the run memories of session 54 (their
# width-2 rates against the one-rank rate timed before the run): 0.2 is two ranks at 0.6x.
CPU_SERIAL_SHARE = 0.2


def _times(seconds: float | None, factor: float) -> float | None:
    """`seconds` x `factor`, None (nothing learned) kept."""
    return None if seconds is None else seconds * factor


@dataclass
class Calibration:
    """The time model's correction, learned from finished steps (None: nothing observed yet)."""

    decode_scale: float | None = None
    overhead_s: float | None = None
    cold_start_s: float | None = None
    host_start_s: float | None = None  # the learner's decode function's start from its pre-start
    rank_start_s: float | None = None  # a learner rank's start, request to joined (`time/rank_start`)
    steps: int = 0
    provisional: bool = False  # learned from a run's first step alone: the next step replaces it

    def profile(self, base: Profile) -> Profile:
        """`base` with its prefill and decode times scaled by what the run measured, and the
        measured cold start (the base's until one was seen)."""
        k = self.decode_scale or 1.0
        cold = base.cold_start_s if self.cold_start_s is None else self.cold_start_s
        if k == 1.0 and cold == base.cold_start_s:  # nothing measured yet: keep its lookup tables
            return base
        return replace(base, prefill_ms=base.prefill_ms * k, decode_ms=base.decode_ms * k, cold_start_s=cold)

    def observe_cold_start(self, seconds: float) -> None:
        self.cold_start_s = ewma(self.cold_start_s, seconds, ALPHA)

    def rescale(self, factor: float) -> None:
        """Its seconds on a machine `factor` times slower (`decode_scale` is a ratio: it stays)."""
        self.overhead_s, self.cold_start_s, self.host_start_s, self.rank_start_s = (
            _times(s, factor)
            for s in (self.overhead_s, self.cold_start_s, self.host_start_s, self.rank_start_s)
        )

    def observe_host_start(self, seconds: float) -> None:
        self.host_start_s = ewma(self.host_start_s, seconds, ALPHA)

    def observe_rank_start(self, seconds: float) -> None:
        self.rank_start_s = ewma(self.rank_start_s, seconds, ALPHA)

    def rank_start(self, base: Profile) -> float:
        """A learner rank's start as the next phase should expect it before this run measured one:
        what earlier runs measured (kept in the run memory), else a function's cold start. A
        rank's is longer (its optimizer, its take of the published weights: 4 s of 10 in a
        session-29 step 1 here), so with the cold start alone a run's first phase waits."""
        if self.rank_start_s is not None:
            return self.rank_start_s
        return base.cold_start_s if self.cold_start_s is None else self.cold_start_s

    def host_wait(self, base: Profile, starting_s: float | None) -> float:
        """What a step waits for the decode function on the learner's resources that has been
        starting for `starting_s` (None: started): the rest of its start as measured from a
        pre-start (started beside the run's pilot and forecast, it is slower than a lone
        function's cold start), the cold start until one was."""
        if starting_s is None:
            return 0.0
        whole = next(s for s in (self.host_start_s, self.cold_start_s, base.cold_start_s) if s is not None)
        return max(0.0, whole - starting_s)

    def observe(
        self,
        measured_busy_s: float,
        model_busy_s: float,
        measured_s: float,
        model_s: float,
        cold_s: float = 0.0,
    ) -> None:
        """Fold in one step: the functions' measured busy (prefill + decode) seconds against the
        base profile's for the same sequences (`model_busy_s`), and the generation's wall time
        against the base model's (`model_s`, the slowest actor). `cold_s`: the longest cold start
        of a decode function in the step, taken to delay the slowest actor. A plan prices cold
        starts apart (`cold_start_s`), and a function started once stays warm, so it is no
        overhead: counted in, a run's first step taught the warm steps after it to wait a start."""
        alpha = 1.0 if self.provisional else ALPHA
        if model_busy_s > 0 and measured_busy_s > 0:
            self.decode_scale = ewma(self.decode_scale, measured_busy_s / model_busy_s, alpha)
        k = self.decode_scale or 1.0
        self.overhead_s = ewma(self.overhead_s, max(0.0, measured_s - cold_s - k * model_s), alpha)
        self.steps += 1
        self.provisional = False

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.decode_scale, self.overhead_s = state.get("decode_scale"), state.get("overhead_s")
        self.cold_start_s, self.host_start_s = state.get("cold_start_s"), state.get("host_start_s")
        self.rank_start_s = state.get("rank_start_s")
        self.steps = int(state.get("steps", 0))
        self.provisional = bool(state.get("provisional", False))


@dataclass
class PhaseModel:
    """Seconds per prompt + response token of the phases after generation, learned per step, and
    apart per learning width the phase ran at (`at_width`). Where the phases' work is billed for
    longer than the step waits on it (preparation overlapped with generation's tail, on GPUs the
    decode actors freed), the billed seconds a token are learned apart (`billed_per_token_s`):
    else the forecast prices hidden work at nothing, and a plan that hides much of it (few decode
    actors, a long tail) looks cheaper than it is."""

    per_token_s: float | None = None
    steps: int = 0
    by_width: dict[int, float] = field(default_factory=dict)
    provisional: bool = False  # learned from a run's first phase alone: the next phase replaces it
    billed_per_token_s: float | None = None
    serial: float = 0.0  # of a phase, the share more ranks do not shorten (`at_width`; not learned)

    def observe(
        self, tokens: float, seconds: float, width: int | None = None, billed_s: float | None = None
    ) -> None:
        """Fold in one step's phases: `seconds` the step waited on them, `billed_s` (where more)
        the seconds their bill stands for on the same units."""
        if tokens > 0:
            alpha = 1.0 if self.provisional else ALPHA
            self.per_token_s = ewma(self.per_token_s, seconds / tokens, alpha)
            billed = seconds if billed_s is None else billed_s
            self.billed_per_token_s = ewma(self.billed_per_token_s, billed / tokens, alpha)
            if width:
                self.by_width[width] = ewma(self.by_width.get(width), seconds / tokens, alpha)
            self.steps += 1
            self.provisional = False

    def rescale(self, factor: float) -> None:
        """Its rates on a machine `factor` times slower."""
        self.per_token_s = _times(self.per_token_s, factor)
        self.billed_per_token_s = _times(self.billed_per_token_s, factor)
        self.by_width = {w: r * factor for w, r in self.by_width.items()}

    def at_width(self, width: int, usual: int) -> float | None:
        """The rate at `width`: as measured there; else the nearest measured width's (`per_token_s`
        standing for the `usual` width before any was measured apart) scaled by Amdahl's law,
        W ranks taking `serial` + (1 - `serial`) / W of one rank's time (`serial` 0: 1/W, data
        parallelism at best), until that width has run once."""
        if width in self.by_width:
            return self.by_width[width]
        seen = self.by_width or ({usual: self.per_token_s} if self.per_token_s is not None else {})
        if not seen:
            return None
        near = min(seen, key=lambda w: (abs(w - width), w))
        return seen[near] * self.amdahl(width) / self.amdahl(near)

    def amdahl(self, width: int) -> float:
        """W ranks' time as a share of one rank's."""
        return self.serial + (1.0 - self.serial) / width

    def state_dict(self) -> dict[str, Any]:
        by_width = {str(w): r for w, r in self.by_width.items()}
        return {
            "per_token_s": self.per_token_s,
            "steps": self.steps,
            "by_width": by_width,
            "provisional": self.provisional,
            "billed_per_token_s": self.billed_per_token_s,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.per_token_s, self.steps = state.get("per_token_s"), int(state.get("steps", 0))
        self.by_width = {int(w): float(r) for w, r in state.get("by_width", {}).items()}
        self.provisional = bool(state.get("provisional", False))
        self.billed_per_token_s = state.get("billed_per_token_s")


@dataclass
class LearnerWait:
    """The learning phase's wait for its extra ranks (`time/learner_start`), learned per step by
    the step's decode-function count N, apart from `PhaseModel`'s rate. A rank starts during
    generation on a slot the decode functions leave free; where they hold the slots the phase's
    width W needs until generation ends (N + W - 1 > the cluster's slots), the phase waits the
    rank's whole start, every slot of the step with it (on two CPU slots: 4.3-7.5 s at N = 2
    against 0.02-1.2 s at N = 1). An N not seen yet waits `start_s` (a rank's start as measured,
    `Calibration.rank_start`; 5.2-7.5 s there, a decode function's cold start 4.0-4.5 s) where it
    is exposed so, else the mean of what unexposed phases waited (0 before any). A run's first
    phase where its N left a slot free teaches nothing here (`StepPlanner.observe`): its ranks
    were requested by a guessed start, or at generation's end (5.2 s waited at N = 1 on two CPU
    slots, 0.01 s on the next such step), and that wait, kept for N = 1, had every later step
    take N = 2.

    Ranks that live across steps (verl's, resident on its held functions' slots) start in a run's
    first phase, which waits their start (5.6 s on two CPU slots, 0.6 s in later phases): that
    wait is learned apart (`resident_s`) and teaches the later phases nothing."""

    waits: dict[int, float] = field(default_factory=dict)
    width: int | None = None  # the last phase's
    resident_s: float | None = None  # a run's first phase, its ranks resident from then on

    def observe(self, n: int, width: int, wait_s: float) -> None:
        self.waits[n] = ewma(self.waits.get(n), wait_s, ALPHA)
        self.width = width

    def rescale(self, factor: float) -> None:
        """Its waits on a machine `factor` times slower."""
        self.waits = {n: w * factor for n, w in self.waits.items()}
        self.resident_s = _times(self.resident_s, factor)

    def observe_resident_start(self, width: int, wait_s: float) -> None:
        self.resident_s = ewma(self.resident_s, wait_s, ALPHA)
        self.width = width

    @staticmethod
    def exposed(n: int, slots: int, width: int) -> bool:
        """Whether `n` decode functions hold, to generation's end, slots a phase of `width` ranks
        on `slots` slots needs: its ranks then start after generation, and it waits their start."""
        return width > 1 and n + width - 1 > slots

    def seconds(
        self,
        slots: int,
        start_s: float,
        resident_start: bool = False,
        width: int | None = None,
        resident: bool = False,
    ) -> tuple[float, ...]:
        """The wait at N = 1 .. `slots` decode functions on a cluster of `slots` slots, for a phase
        of `width` ranks (default: the last phase's; before any, the widest it may take); at least
        the resident ranks' start where this phase starts them (`resident_start`). `resident`
        ranks (verl's) live on the held slots, so no N leaves them a start to wait."""
        width = width or self.width or slots

        def starts(n: int) -> bool:  # the phase at `n` waits its ranks' start
            return not resident and self.exposed(n, slots, width)

        hidden = [w for n, w in self.waits.items() if not starts(n)]
        unseen_hidden = sum(hidden) / len(hidden) if hidden else 0.0
        waits = [self.waits.get(n, start_s if starts(n) else unseen_hidden) for n in range(1, slots + 1)]
        if resident_start and width > 1:
            first = start_s if self.resident_s is None else self.resident_s
            waits = [max(w, first) for w in waits]
        return tuple(waits)

    def state_dict(self) -> dict[str, Any]:
        waits = {str(n): w for n, w in self.waits.items()}
        return {"waits": waits, "width": self.width, "resident_s": self.resident_s}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.waits = {int(n): float(w) for n, w in state.get("waits", {}).items()}
        self.width, self.resident_s = state.get("width"), state.get("resident_s")


# Predicted lengths scaled so for a forecast's low and high ends: the range it may fall in.
LENGTH_RANGE = (0.5, 1.5)
# How far one speed probe's reading moves from the next, seconds apart (session 62: 0.89-1.09).
PROBE_NOISE = 1.1
# How much slower than its forecast a machine's first run ran, with no earlier run's decode scale:
# its functions share the cores, which the table's lone process did not (whole-run forecasts
# 17-29% short in sessions 53, 54 and 62: runs 1.2-1.4x their forecast).
FIRST_RUNS = 1.4


def speed_range(scales: list[float], drift: float | None = None) -> tuple[float, float, str]:
    """How much faster and slower than the point forecast a run may go, beyond its lengths: the
    machine's speed, which the range's lengths do not vary. Each earlier run's decode `scale` is
    its decode steps over the table at the speed its probe read, so their spread about the median
    (the scale the forecast takes) is how far runs here have strayed from a forecast of their
    speed, probe error included; never narrower than one probe's noise. Before two runs say so:
    up to `FIRST_RUNS` slower. `drift`: how many times slower this run's probe reads the machine
    than the earlier runs ran (None: no earlier run); a passing load may have made it so, so the
    range also holds the run at their speed. Returns the low and high factors and their basis."""
    if len(scales) < 2:
        low, high, basis = 1 / PROBE_NOISE, FIRST_RUNS, "no two earlier runs' decode scales here"
    else:
        usual = float(np.median(scales))
        low, high = min(min(scales) / usual, 1 / PROBE_NOISE), max(max(scales) / usual, PROBE_NOISE)
        basis = f"the last {len(scales)} runs' decode scales here"
    if drift is not None and not low <= (theirs := 1 / drift) <= high:
        low, high = min(low, theirs), max(high, theirs)
        basis += f"; at the earlier runs' speed, which the probe reads x{drift:.2f}"
    return low, high, f"machine speed x{low:.2f} .. x{high:.2f} ({basis})"


@dataclass
class Margins:
    """How far the step forecast has fallen short lately, so that a budget or deadline is met
    although its plan sits at the edge: the 90th percentile of the last `window` steps' actual /
    forecast ratios, less one (0 when the forecast has erred high), plus a prior that shrinks as
    steps are observed. Before any step, the prior is the forecast range's high end (predicted
    lengths x 1.5); after k steps whose ratios it kept it is a (k + 1)-th of that, because a
    quantile of a few ratios says little (a run's later epochs may err the other way)."""

    window: int = 8
    time: list[float] | None = None
    cost: list[float] | None = None
    steps: int = 0
    prior: float = LENGTH_RANGE[1] - 1.0

    def observe(self, forecast: dict[str, float], actual: dict[str, float]) -> None:
        """Fold in one step's forecast and actual figures, by name ("time", "cost"); the run's
        first is left out (its forecast knew nothing of the run)."""
        self.steps += 1
        if self.steps == 1:
            return
        for name, f in forecast.items():
            a = actual.get(name, 0.0)
            if f > 0 and a > 0:
                ratios = (getattr(self, name) or []) + [a / f]
                setattr(self, name, ratios[-self.window :])

    def margin(self, name: str) -> float:
        ratios = getattr(self, name) or []
        seen = max(0.0, float(np.quantile(ratios, 0.9)) - 1.0) if ratios else 0.0
        return seen + self.prior / max(1, self.steps)  # the first step taught it nothing

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.time, self.cost, self.steps = state.get("time"), state.get("cost"), int(state.get("steps", 0))


# A step's `versus_verl` quotient over P prompts scatters about its mean with a standard deviation
# of about NOISE / sqrt(P) (measured: 0.5-1% a step at 512 prompts in the simulator, 9% at 8 in the
# default run), while the shortfall itself has been within SPREAD of 1 wherever measured (0.6-1.4%).
# Shrunk toward 1 by that prior, a run weighs its prompts' evidence against (NOISE / SPREAD)^2
# prompts' worth of none; before it has any, it takes the middle of that range, SPREAD / 2.
NOISE, SPREAD = 0.2, 0.02
# A split's quotient against the best single size of its step (`versus_single`), measured over
# `benchmarks/bench_sweep.py`'s scenarios (seed 1; 140 simulated steps where a split was weighed):
# median 1.03, 10-90% 0.97-1.22. Until a run measures its own, a split is weighed stretched by it.
SPLIT_PRIOR = 1.03


@dataclass
class Shortfall:
    """How much further short than verl's the run's plans' forecasts have lately fallen, from the
    lengths alone, so that a plan capped at verl's generation time is not slower on average (and,
    kept apart, how much further short a split's than the best single size's: `versus_single`).
    Each step gives a quotient (`versus_verl`: the plan over verl's plan of the step, at the
    observed lengths, over the same at the predicted ones; verl does not run, but its plan is timed
    by the same model). `factor` is their prompt-weighted mean over the last `window` steps, shrunk
    toward 1 by a prior worth (NOISE / SPREAD)^2 prompts. It falls below 1 where the plans'
    forecasts have fallen less short than verl's, that is, been too long: their times carry the
    run's tail (`tail.Tail`), which on a step of wide ranges can outweigh what it adds to
    verl's even split. The cap then rises above verl's forecast by as much. The run's first step
    is left out unless `first`: its predictions knew nothing of the run. Until a quotient is
    measured, `factor` is `unknown`, by default 1 + SPREAD / 2, the middle of where the shortfall
    has been measured: a first step's plan rests on first-epoch estimates alone, and at 1 PPO
    Qwen2.5-7B LCB's (paper-physical, simulated) fell 1.4% short of its forecast and generated
    slower than verl's."""

    window: int = 8
    quotients: list[float] | None = None
    prompts: list[int] | None = None
    steps: int = 0
    unknown: float = 1.0 + SPREAD / 2  # `factor` until a quotient is measured
    first: bool = False  # whether the run's first step teaches it

    def observe(self, versus: tuple[float, float] | None, prompts: int) -> None:
        self.steps += 1
        if (self.steps == 1 and not self.first) or versus is None or min(versus) <= 0:
            return
        self.quotients = ((self.quotients or []) + [versus[1] / versus[0]])[-self.window :]
        self.prompts = ((self.prompts or []) + [prompts])[-self.window :]

    def factor(self) -> float:
        if not self.quotients:
            return self.unknown
        q, p = np.asarray(self.quotients), np.asarray(self.prompts, dtype=float)
        excess = float((p * (q - 1.0)).sum() / (p.sum() + (NOISE / SPREAD) ** 2))
        return 1.0 + excess

    def state_dict(self) -> dict[str, Any]:
        """What the run learned (`unknown` and `first` are how it was made, not state)."""
        return {"quotients": self.quotients, "prompts": self.prompts, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.quotients, self.prompts = state.get("quotients"), state.get("prompts")
        self.steps = int(state.get("steps", 0))


def relative_error(forecast: float, actual: float) -> float:
    """forecast / actual - 1 (0: exact; +0.2: 20% over); nan when nothing happened."""
    return forecast / actual - 1.0 if actual > 0 else float("nan")
