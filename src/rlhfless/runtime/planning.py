"""The bridge from a training step to the planner: the step's plan, and what the run teaches the
forecast (what this machine is to the planner: `runtime.machine`).

After every step `StepPlanner.observe` folds the measured times into the calibration (the time
model), the phase model (preparation and learning) and the cold-start estimate, and returns the
step's forecast against what happened.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from rlhfless.config import Config
from rlhfless.models import model_shape
from rlhfless.planner import (
    ClusterSpec,
    LengthPredictor,
    Profile,
    PromptSpec,
    SchedulerConfig,
    StepPlan,
    plan_step,
)
from rlhfless.planner.billing import Billing, LearningWidth
from rlhfless.planner.dedup import PackedPrompts, tree_tokens
from rlhfless.planner.floor import generation_floor
from rlhfless.planner.forecast import (
    CPU_SERIAL_SHARE,
    Calibration,
    LearnerWait,
    Margins,
    PhaseModel,
    Shortfall,
)
from rlhfless.planner.replay import replay_times, versus_verl
from rlhfless.runtime.machine import Speed, learning_width, machine_cluster, machine_profile, memory_path
from rlhfless.runtime.plan_metrics import forecast_metrics
from rlhfless.runtime.run_memory import RunMemory
from rlhfless.runtime.samples import Sample, StepPrompt, response_lengths


def build_planner(cfg: Config, policy: torch.nn.Module) -> StepPlanner:
    """The run's StepPlanner: this machine's profile and slots, the learner's slot resident."""
    shape = model_shape(policy)
    profile, speed = machine_profile(cfg, policy)
    return StepPlanner(
        cfg.scheduler,
        profile,
        machine_cluster(cfg.runtime, cfg.scheduler.gpus_per_actor, shape),
        cfg.algorithm.group_size,
        max_length=cfg.generation.max_new_tokens,
        resident_units=float(cfg.scheduler.gpus_per_actor),  # the learner's slot, held all step
        memory=memory_path(cfg, policy),
        learning_units=float(cfg.scheduler.gpus_per_actor * learning_width(cfg)),
        widths=learning_width(cfg) if _elastic(cfg) else 1,
        speed=speed,
        # Measured on CPU slots (gloo); GPU ranks not yet: data parallelism at best there.
        serial=CPU_SERIAL_SHARE if cfg.runtime.device != "cuda" else 0.0,
    )


def _elastic(cfg: Config) -> bool:
    """Whether the learning phase's width is the planner's to choose each step: the Ray executor's
    elastic learner (not verl's resident ranks) with no `runtime.learner_width` set."""
    return cfg.runtime.executor == "ray" and cfg.scheduler.policy != "verl" and not cfg.runtime.learner_width


def prompt_specs(prompts: list[StepPrompt], answer_tokens: list[int | None]) -> list[PromptSpec]:
    """What the planner reads of tokenized prompts, with each one's answer length."""
    return [
        PromptSpec(p.uid, p.prompt_ids, a, p.prompt.data_source)
        for p, a in zip(prompts, answer_tokens, strict=True)
    ]


class StepPlanner:
    """Calls the planner each step with this run's profile, cluster and settings, corrected by
    what the run has measured so far."""

    def __init__(
        self,
        scheduler: SchedulerConfig,
        profile: Profile,
        cluster: ClusterSpec,
        group_size: int,
        max_length: int | None = None,
        resident_units: float = 0.0,
        memory: Path | None = None,
        learning_units: float | None = None,
        widths: int = 1,
        speed: Speed | None = None,
        serial: float = 0.0,
    ):
        """`memory`: where the time model learned by earlier runs of this model on this machine is
        kept; it starts this run's, scaled from the machine's speed when it was written to its
        `speed` now, and every step updates it. `widths`: the learning phase may take 1 .. this
        many ranks, which a budget or deadline chooses with N (1: the phase's width is not the
        plan's; its units are `learning_units`). `serial`: the share of a learning phase that more
        ranks do not shorten, for widths not run yet (`PhaseModel.at_width`)."""
        self.scheduler, self.profile, self.cluster, self.group_size = scheduler, profile, cluster, group_size
        self.max_length, self.resident_units = max_length, resident_units
        self.learning_units = resident_units if learning_units is None else learning_units
        self.widths = widths
        self.calibration = Calibration()
        self.phases = PhaseModel(serial=serial)
        self.waits = LearnerWait()
        self.margins = Margins()
        self.shortfall = Shortfall()
        self.observed = 0  # steps this run (this process) has observed
        self.slots = cluster.max_actors(profile.gpus)  # the last plan's cluster's
        self.speed = speed
        self.memory = RunMemory(memory) if memory is not None else None
        self.first_ratio: float | None = None  # the run's first step's decode ratio to the table
        earlier = self.memory.read() if self.memory is not None else {}
        # How many times slower the probe reads the machine now than the earlier runs ran on it.
        self.drift = speed.since(earlier.get("probe_ms")) if earlier and speed is not None else None
        if earlier:
            self.load_state_dict(earlier)
            # They start the run (its forecast, its first plans); the run's first step that
            # teaches replaces them, not halves them: they were learned at another probe's speed.
            self.calibration.provisional = self.phases.provisional = True

    def rescale(self, factor: float) -> None:
        """Every second learned (by earlier runs, or before a resume), on a machine `factor` times
        slower now than when it was learned. The decode scale stays: it is a ratio to the table,
        which the machine's speed scales already."""
        for part in (self.calibration, self.phases, self.waits):
            part.rescale(factor)

    def billing(
        self,
        warm: int,
        cluster: ClusterSpec,
        profile: Profile,
        host_starting_s: float | None = None,
        first: bool = False,
    ) -> Billing:
        """The runtime: functions start on demand, the learner holds its units all step and its
        phase waits for its ranks as it has lately at each N (a function's start where unseen);
        the decode function on its resources has been starting for `host_starting_s` (None:
        started); `first`: the run's first step in this process, whose phase starts verl's
        resident ranks."""
        slots = cluster.max_actors(profile.gpus)
        verl = self.scheduler.policy == "verl"
        return Billing(
            self.scheduler.pricing,
            resident_units=self.resident_units,
            warm_actors=warm,
            host_start_s=self.calibration.host_wait(self.profile, host_starting_s),
            overhead_s=self.calibration.overhead_s or 0.0,
            after_units=self.learning_units,
            after_per_token_s=self._usual_rate() or 0.0,
            next_use_after=True,
            time_margin=self.margins.margin("time"),
            cost_margin=self.margins.margin("cost"),
            generation_shortfall=self.shortfall.factor(),
            learner_wait_s=self.waits.seconds(
                slots, self.calibration.rank_start(profile), resident_start=verl and first, resident=verl
            ),
            # verl's ranks are resident on its held slots: started once, in the run's first phase
            rank_start_s=0.0 if verl else self.calibration.rank_start(profile),
            widths=self._width_options(slots, profile),
        )

    @property
    def _usual(self) -> int:
        """The learning phase's width with every slot free (`learning_units`' ranks)."""
        return max(1, round(self.learning_units / max(self.resident_units, 1e-12)))

    def learned_alone(self, per_token_s: float) -> None:
        """The phases' rate as one process timed it before the run, where no earlier run taught
        one (`run_forecast.learning_seconds_per_token`): one rank's rate. A learner on `_usual`
        ranks is forecast at `PhaseModel.at_width`'s rule (Amdahl's law) until its first phase is
        measured; taken as the usual width's own, it forecast two ranks' learning at twice what
        they took (session 51), and at 1/W a first run's learning 7-27% short (session 54)."""
        if self.widths > 1:
            self.phases.by_width[1] = per_token_s
        self.phases.per_token_s = per_token_s * self.phases.amdahl(self._usual)

    def _usual_rate(self) -> float | None:
        """The phases' rate a plan without a target forecasts with: where the width is the plan's
        (a target may have taken another on earlier steps or runs), the usual width's."""
        return self.phases.at_width(self._usual, self._usual) if self.widths > 1 else self.phases.per_token_s

    def _width_options(self, slots: int, profile: Profile) -> tuple[LearningWidth, ...]:
        """Learning widths 1 .. `widths`, each at its own rate (`PhaseModel.at_width`) and wait
        for its ranks; none before the phases' rate is known, or where the width is not the
        plan's."""
        if self.widths < 2:
            return ()
        options = []
        for w in range(1, self.widths + 1):
            rate = self.phases.at_width(w, self._usual)
            if rate is None:
                return ()
            start = self.calibration.rank_start(profile) if w > 1 else 0.0
            waits = self.waits.seconds(slots, start, width=w) if w > 1 else (0.0,)
            options.append(LearningWidth(w, w * self.resident_units, rate, waits, start))
        return tuple(options)

    def plan(
        self,
        prompts: list[StepPrompt],
        answer_tokens: list[int | None],
        predictor: LengthPredictor,
        warm: int = 0,
        cluster: ClusterSpec | None = None,
        host_starting_s: float | None = None,
        first: bool = False,
    ) -> StepPlan:
        """The step's plan for `cluster` (what the executor has now) or the run's fixed one;
        `warm` and `host_starting_s` as the executor's `warm_functions` and `host_starting_s`;
        `first`: the run's first step in this process."""
        profile, cluster = self.calibration.profile(self.profile), cluster or self.cluster
        self.slots = cluster.max_actors(profile.gpus)  # the step's, for `observe`
        return plan_step(
            prompt_specs(prompts, answer_tokens),
            predictor,
            profile,
            cluster,
            self.scheduler,
            self.group_size,
            self.billing(warm, cluster, profile, host_starting_s, first),
            self.max_length,
        )

    def plan_validation(
        self,
        prompts: list[StepPrompt],
        answer_tokens: list[int | None],
        predictor: LengthPredictor,
        samples: int,
        warm: int = 0,
        cluster: ClusterSpec | None = None,
        host_starting_s: float | None = None,
    ) -> StepPlan:
        """A validation's plan: `samples` responses to each held-out prompt on decode functions,
        chosen by lam as a step's generation is (`warm`, `cluster`, `host_starting_s` as `plan`
        takes them), with nothing after it (no learning waits on its functions, no rank starts)
        and no step budget or deadline to meet (those are the training step's)."""
        profile, cluster = self.calibration.profile(self.profile), cluster or self.cluster
        billing = replace(
            self.billing(warm, cluster, profile, host_starting_s),
            after_units=0.0,
            after_fixed_s=0.0,
            after_per_token_s=0.0,
            after_billed_per_token_s=None,
            learner_wait_s=(),
            rank_start_s=0.0,
            widths=(),
        )
        scheduler = replace(self.scheduler, budget_per_step=None, deadline_per_step=None)
        specs = prompt_specs(prompts, answer_tokens)
        return plan_step(specs, predictor, profile, cluster, scheduler, samples, billing, self.max_length)

    def alone_seconds(
        self,
        prompts: list[StepPrompt],
        answer_tokens: list[int | None],
        predictor: LengthPredictor,
        group_size: int,
    ) -> float:
        """Seconds one engine takes to generate `group_size` responses to each prompt on its own
        (a validation on the learner's engine): verl's plan of one actor on the run's calibrated
        profile, from `predictor`'s lengths."""
        specs = prompt_specs(prompts, answer_tokens)
        profile = self.calibration.profile(self.profile)
        one = replace(self.cluster, node_gpus=(profile.gpus,))
        alone = replace(self.scheduler, policy="verl", budget_per_step=None, deadline_per_step=None)
        return plan_step(
            specs, predictor, profile, one, alone, group_size, max_length=self.max_length
        ).predicted_time

    def observe(self, plan: StepPlan, samples: list[Sample], metrics: dict[str, float]) -> dict[str, float]:
        """The step's forecast against what happened, and its floor; then learn from it for the
        next plan."""
        out = forecast_metrics(plan, metrics) | self.floor_metrics(plan, samples, metrics)
        lengths = response_lengths(samples)
        prompt_tokens = {s.uid: len(s.prompt_ids) for s in samples}
        self.margins.observe(
            {"time": plan.predicted_step_time, "cost": plan.predicted_step_cost},
            {"time": metrics["time/step"], "cost": metrics.get("cost/step", 0.0)},
        )
        versus = self._versus_verl(plan, lengths, prompt_tokens)
        if versus is not None:
            out["forecast/versus_verl"], out["forecast/versus_verl_observed"] = versus
        self.shortfall.observe(versus, len(plan.predicted_length))
        out["forecast/shortfall"] = self.shortfall.factor()
        busy, total = replay_times(plan, lengths, prompt_tokens, self.profile, self.scheduler.segments)
        prefill = float(self.profile.prefill_seconds(plan.prefill.get("tokens", 0)))
        measured_busy = metrics.get("time/prefill", 0.0) + metrics.get("time/decode", 0.0)
        # A run's first generation runs on functions whose memory is touched for the first time
        # (its prefill took 32.6 s against 12-14 s later in a verl run here), so, like its first
        # learning phase below, it teaches the time model only where no earlier step has, and
        # there only until the next step, whose figures replace its own. Its decode scale is the
        # exception where earlier runs measured how far a first step runs over (`first_scale`):
        # a wrongly probed run then forecasts its step 2 right.
        first = not self.observed
        model_busy = float(busy.sum()) + prefill
        if first and model_busy > 0 and measured_busy > 0:
            self.first_ratio = measured_busy / model_busy
        if not first or not self.calibration.steps:
            self.calibration.observe(
                measured_busy,
                model_busy,
                metrics["time/generation"],
                float(total.max()) + prefill,
                metrics.get("time/decode_cold_start", 0.0),
            )
            self.calibration.provisional = first
        elif self.memory is not None and self.first_ratio is not None:
            self.calibration.decode_scale = (
                self.memory.first_scale(self.first_ratio) or self.calibration.decode_scale
            )
        if "time/host_start" in metrics:
            self.calibration.observe_host_start(metrics["time/host_start"])
        if "time/rank_start" in metrics:
            self.calibration.observe_rank_start(metrics["time/rank_start"])
        if metrics.get("actors/cold_starts"):
            self.calibration.observe_cold_start(metrics["time/cold_start"] / metrics["actors/cold_starts"])
        tokens = float(sum(len(s.prompt_ids) + len(s.response_ids) for s in samples))
        # A run's first phase pays once for what later ones do not (its ranks' start, exposed
        # before any was measured; first touches), so it teaches the rate only where no step of
        # an earlier run (or of the checkpoint resumed) has, and there until the next phase's
        # rate replaces it: else it is left out.
        wait = metrics.get("time/learner_start", 0.0)  # apart from the rate: it depends on N
        width = int(metrics.get("learner/width", 1))
        if "time/learner_start" in metrics:
            if self.scheduler.policy == "verl" and not self.observed:  # its ranks' start
                self.waits.observe_resident_start(width, wait)
            elif first and not self.waits.exposed(plan.n_actors, self.slots, width):
                pass  # its ranks' start on a free slot was timed by a guess (`LearnerWait`)
            elif width > 1 or self.widths == 1:  # one rank of several widths: no figure for the others
                self.waits.observe(plan.n_actors, width, wait)
        if not first or not self.phases.steps:
            after = metrics["time/step"] - metrics["time/generation"] - wait
            self.phases.observe(tokens, after, width if self.widths > 1 else None)
            self.phases.provisional = first
        self.observed += 1
        if self.memory is not None:
            state = {
                "calibration": self.calibration.state_dict(),
                "phases": self.phases.state_dict(),
                "waits": self.waits.state_dict(),
                "probe_ms": self._probe_ms(),
            }
            # the run's own scale, once a step after its first (every one observes) has taught it
            scale = self.calibration.decode_scale if self.observed > 1 else None
            excess = self.first_ratio / scale if scale and self.first_ratio else None
            self.memory.write(state, scale, excess)
        out["calibration/decode_scale"] = self.calibration.decode_scale or 1.0
        if first and self.first_ratio is not None:
            out["calibration/first_ratio"] = self.first_ratio
        out["calibration/overhead_s"] = self.calibration.overhead_s or 0.0
        out["calibration/after_s_per_token"] = self.phases.per_token_s or 0.0
        return out

    def _versus_verl(
        self, plan: StepPlan, lengths: dict[str, list[int]], prompt_tokens: dict[str, int]
    ) -> tuple[float, float] | None:
        """`replay.versus_verl` for the step's samples (None unless every prompt has all of them)."""
        uids = list(plan.predicted_length)
        if not all(len(lengths.get(u, ())) == self.group_size for u in uids):
            return None
        observed = np.array([lengths[u] for u in uids], dtype=float)
        tokens = np.array([prompt_tokens[u] for u in uids], dtype=float)
        return versus_verl(plan, observed, tokens, self.profile, self.scheduler.segments)

    def floor_metrics(
        self, plan: StepPlan, samples: list[Sample], metrics: dict[str, float]
    ) -> dict[str, float]:
        """The generation floor of the step's true lengths on the profile its plan used (as
        calibrated so far), and the measured generation's time and cost over it."""
        if not samples:
            return {}
        floor = generation_floor(
            [(self.calibration.profile(self.profile), int(plan.floor.get("actors", 1)))],
            np.array([len(s.prompt_ids) for s in samples]),
            np.array([len(s.response_ids) for s in samples]),
            tree_tokens(PackedPrompts.pack(list({s.uid: s.prompt_ids for s in samples}.values()))),
            self.scheduler.pricing,
        )
        ratios = floor.ratios(metrics.get("time/generation", 0.0), metrics.get("cost/generation", 0.0))
        out = {
            "floor/generation_s": floor.time_s,
            "floor/latency_s": floor.latency_s,
            "floor/throughput_s": floor.throughput_s,
            "floor/work_cost": floor.work_cost,
            "floor/time_over": ratios["time_over_floor"],
        }
        if "cost/generation" in metrics:  # billed executors only
            out["floor/cost_over"] = ratios["cost_over_floor"]
        return out

    def state_dict(self) -> dict:
        return {
            "calibration": self.calibration.state_dict(),
            "phases": self.phases.state_dict(),
            "waits": self.waits.state_dict(),
            "margins": self.margins.state_dict(),
            "shortfall": self.shortfall.state_dict(),
            "probe_ms": self._probe_ms(),
        }

    def load_state_dict(self, state: dict) -> None:
        """`state` as learned, its seconds scaled from the machine's speed then (`probe_ms`) to
        its speed now, where both were probed."""
        self.calibration.load_state_dict(state.get("calibration", {}))
        self.phases.load_state_dict(state.get("phases", {}))
        self.waits.load_state_dict(state.get("waits", {}))
        self.margins.load_state_dict(state.get("margins", {}))
        self.shortfall.load_state_dict(state.get("shortfall", {}))
        if self.speed is not None:
            self.rescale(self.speed.since(state.get("probe_ms")))

    def _probe_ms(self) -> list[float] | None:
        """The machine's speed as this run probed it (None: its table was not measured here)."""
        return list(self.speed.now_ms) if self.speed is not None else None
