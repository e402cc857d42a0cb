"""One simulated training step: plan with the planner, generate (`sim.generation`), then
preparation (reference and, for PPO, critic forward) and learning on all GPUs.

Billing goes through the one pricing model (`planner.pricing.charge`): `verl` holds every GPU for
the whole step (serverful). Under other policies the learner hands its GPUs to the decode functions
(`Billing.handoff`): each is billed from generation's start to its release, then its GPUs until the
learner takes them back at generation's end, idle or through a restart (a cold start), as the plan
decided; GPUs no actor took likewise; and every GPU for preparation and learning.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rlhfless.planner.billing import Billing, handback
from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.dedup import PackedPrompts, tree_tokens
from rlhfless.planner.floor import Floor, generation_floor
from rlhfless.planner.forecast import SPLIT_PRIOR, Margins, PhaseModel, Shortfall
from rlhfless.planner.pilot import pilot_context, pilot_prompts
from rlhfless.planner.predictor import LengthPredictor
from rlhfless.planner.pricing import charge, keep_warm
from rlhfless.planner.profile import Profile
from rlhfless.planner.replay import versus_single, versus_verl
from rlhfless.planner.sizes import plan_shapes
from rlhfless.planner.step_plan import PromptSpec, StepPlan
from rlhfless.sim.execution import schedule, slot_cap
from rlhfless.sim.generation import Generation
from rlhfless.sim.overlap import FreeGpus, Overlap, overlap_preparation
from rlhfless.sim.stage import Stage
from rlhfless.sim.workload import StepPrompts

__all__ = ["Simulator", "Stage", "StepResult"]


SOURCE = "workload"  # the data source of every simulated prompt: one workload, one source


@dataclass
class StepResult:
    """What one simulated step cost and how long each part took."""

    step: int
    time: float
    generation: float
    preparation: float
    learning: float
    cost: float
    cost_generation: float
    n_actors: int
    migrations: int
    prefill_tokens: int  # prompt tokens computed: the prefill actor's levels + each prompt's own part
    plan_seconds: float
    predicted_time: float
    predicted_cost: float
    predicted_step_time: float
    predicted_step_cost: float
    tokens: float
    mean_response: float
    actors: list[dict[str, float]]
    floor_time: float = 0.0  # the generation floor of this step's true lengths (`planner.floor`)
    floor_latency: float = 0.0
    floor_throughput: float = 0.0
    floor_cost: float = 0.0  # the work floor, USD
    generation_over_floor: float = 1.0
    cost_over_floor: float = 1.0
    forecast_floor_time: float = 0.0  # the plan's floor, from predicted lengths
    cost_after: float = 0.0  # preparation and learning, USD (the whole-step bound adds it to the floor)
    preparation_overlapped: float = 0.0  # preparation run during generation, in all-GPU seconds
    prefill_unique: int = 0  # the step's unique prompt tokens (its prefix tree's)
    prefill_tree_ratio: float = 1.0  # prefill_tokens / prefill_unique: 1.0 is the least
    # The length pilot before this step (the first only), outside its figures as in the runtime.
    pilot_prompts: int = 0
    pilot_seconds: float = 0.0
    pilot_cost: float = 0.0
    actor_gpus: float = 0.0  # GPUs per decode actor (its tensor-parallel size; a split's mean)
    untaken_gpus: float = 0.0  # GPUs no decode actor took from the learner (none under verl)
    untaken_warm: bool = False  # ... kept warm for it through generation, else restarted

    def row(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Simulator:
    """Runs the steps of one policy: plan with the planner, execute, bill, feed the predictor."""

    def __init__(self, stage: Stage, config: SchedulerConfig, predictor: LengthPredictor) -> None:
        self.stage, self.config, self.predictor = stage, config, predictor
        self.serverful = config.policy == "verl"
        cold = 0.0 if self.serverful else stage.cold_start_s
        self.planner_profile = replace(stage.profile, cold_start_s=cold)
        # rlhfless's actor scaling chooses each actor's shape with N; the baselines keep model.tp.
        profiles = stage.decode_profiles() if config.features["actor_scaling"] else [stage.profile]
        self.planner_profiles = [replace(p, cold_start_s=cold) for p in profiles]
        # Preparation + learning seconds per token: known exactly here (the execution's own
        # formula), learned per step in the runtime.
        rate = stage.after_per_token_s
        self.phases = PhaseModel(per_token_s=rate, billed_per_token_s=rate)
        self.margins = Margins()  # how far the step forecast fell short lately (budget, deadline)
        self.shortfall = Shortfall()  # how much further short than verl's (verl's cap)
        self.split_shortfall = Shortfall(unknown=SPLIT_PRIOR, first=True)  # a split's than a single size's

    def billing(self) -> Billing:
        """The simulated executor: the learner hands every GPU over for generation and takes it
        back for the rest of the step (before the run's first step the functions load the
        checkpoint, as verl's workers do); no resident learner."""
        return Billing(
            self.stage.pricing,
            handoff=True,
            after_units=float(self.stage.total_gpus),
            after_per_token_s=self.phases.per_token_s or 0.0,
            after_billed_per_token_s=self.phases.billed_per_token_s,
            time_margin=self.margins.margin("time"),
            cost_margin=self.margins.margin("cost"),
            generation_shortfall=self.shortfall.factor(),
            split_shortfall=self.split_shortfall.factor(),
        )

    def plan(self, prompts: StepPrompts) -> StepPlan:
        specs = [
            PromptSpec(uid, tokens, int(answer) or None, SOURCE)
            for uid, tokens, answer in zip(
                prompts.uids, prompts.prompt_tokens, prompts.answer_tokens, strict=True
            )
        ]
        g = prompts.lengths.shape[1]
        if self.config.predictor == "oracle":
            for uid, lengths in zip(prompts.uids, prompts.lengths.tolist(), strict=True):
                self.predictor.reveal(uid, lengths)
        if self.config.predictor == "expected":
            if prompts.law is None:
                raise ValueError(
                    "scheduler.predictor: got 'expected', expected prompts with their length "
                    "distribution (a synthetic workload's; a trace holds only samples)"
                )
            for uid, (gmax, gmean) in zip(prompts.uids, prompts.law.expected(g).tolist(), strict=True):
                self.predictor.reveal_expected(uid, gmax, gmean)
        return plan_shapes(
            specs,
            self.predictor,
            self.planner_profiles,
            self.stage.cluster,
            self.config,
            g,
            self.billing(),
            self.stage.max_response,  # as the runtime caps predictions at max_new_tokens
            baseline=self.planner_profile,  # model.tp: verl's size, whose time caps lam's N
        )

    def run_step(self, step: int, prompts: StepPrompts) -> StepResult:
        piloted = 0
        if step == 0 and self.config.length_pilot:
            cap = self.stage.max_response or self.config.default_length  # a trace's cap: unknown
            context = pilot_context(prompts.prompt_lengths, cap)
            g = prompts.lengths.shape[1]
            actors = self.stage.cluster.max_actors(self.planner_profile.gpus)
            piloted = pilot_prompts(self.planner_profile, self.config.length_pilot, g, context, actors)
            self.pilot(prompts, piloted)
        plan = self.plan(prompts)
        result = self.execute(step, prompts, plan)
        if piloted:
            seconds = pilot_seconds(
                self.stage.profile, prompts.prompt_lengths[:piloted], prompts.lengths[:piloted]
            )
            result.pilot_prompts, result.pilot_seconds = piloted, seconds
            result.pilot_cost = charge(self.stage.pricing, self.stage.profile.gpus, seconds)
        planned = [plan.predicted_length[u] for u in prompts.uids]
        self.predictor.update_many(prompts.uids, prompts.lengths, self.stage.max_response, planned)
        self.phases.observe(
            result.tokens, result.preparation + result.learning, billed_s=self.billed_s(result)
        )
        self.margins.observe(
            {"time": plan.predicted_step_time, "cost": plan.predicted_step_cost},
            {"time": result.time, "cost": result.cost},
        )
        versus = versus_verl(
            plan,
            prompts.lengths,
            prompts.prompt_lengths,
            plan.profile or self.planner_profile,
            self.config.segments,
            self.planner_profile,  # verl's size (model.tp)
        )
        self.shortfall.observe(versus, len(prompts.uids))
        split = None  # the split weighed against the best single size, where one was
        if plan.split_versus is not None:
            split = versus_single(
                *plan.split_versus,
                plan.predicted_mean,
                prompts.lengths,
                prompts.prompt_lengths,
                self.planner_profile,
                self.config.segments,
            )
        self.split_shortfall.observe(split, len(prompts.uids))
        return result

    def billed_s(self, result: StepResult) -> float:
        """The seconds on every GPU that the step's bill after generation stands for: its
        preparation and learning, the preparation it ran during generation and that work's weight
        loads."""
        per_second = charge(self.stage.pricing, self.stage.total_gpus, 1.0)
        if per_second > 0:
            return result.cost_after / per_second
        return result.preparation + result.preparation_overlapped + result.learning

    def pilot(self, prompts: StepPrompts, count: int) -> None:
        """The runtime's length pilot (`scheduler.length_pilot`, widened by `planner.pilot`):
        `count` prompts of the source sampled G times before the first step, under uids of their
        own, so that the prompts stay unseen and the first plan starts from the source's lengths
        (and, where their answers fit them, from each prompt's answer) instead of `default_length`."""
        uids = [f"pilot:{uid}" for uid in prompts.uids[:count]]
        answers = [int(a) or None for a in prompts.answer_tokens[:count]]
        self.predictor.predict(uids, answers, [SOURCE] * len(uids))
        self.predictor.update_many(uids, prompts.lengths[:count], self.stage.max_response)

    def execute(self, step: int, prompts: StepPrompts, plan: StepPlan) -> StepResult:
        gens = []  # one generation per part of a plan split between sizes, no migration between
        for part in plan.pools or [plan]:
            st = self.stage.at_shape(part.actors[0].gpus)  # the decode actors' size, as planned
            mine = prompts.subset(part.predicted_length) if plan.pools else prompts
            gens.append(Generation(st, self.config, mine, part, self.serverful))
            gens[-1].run()
        st = self.stage
        runs = [r for gen in gens for r in gen.runs]
        true = np.concatenate([gen.true for gen in gens])
        generation = max(r.released for r in runs)
        tokens = float(true.sum() + sum(gen.prompt_len.sum() for gen in gens))
        preparation, learning = st.phase_seconds(tokens)
        overlap = self.overlap(gens, generation, preparation, tokens)
        preparation = overlap.left_gpu_s / st.total_gpus
        total = generation + preparation + learning
        warm, untaken, untaken_warm = [False] * len(runs), 0.0, False  # handed back to the learner
        if self.serverful:
            cost_generation = charge(st.pricing, st.total_gpus, generation)
        else:  # the prefill runs on the colocated actor's GPUs, inside its bill
            # Each released actor's GPUs go back to the learner as the plan decided (warm or
            # restarted, `billing.handback`); the GPUs no actor took as its forecast time decides.
            cold = st.cold_start_s
            warm = [a.keep_warm for a in plan.actors]
            untaken = float(st.total_gpus - sum(r.gpus for r in runs))
            untaken_warm = bool(keep_warm(st.pricing, plan.predicted_time, cold, 0.0))
            cost_generation = sum(
                charge(st.pricing, r.gpus, r.released)
                + handback(st.pricing, r.gpus, generation - r.released, w, cold)
                for r, w in zip(runs, warm, strict=True)
            ) + handback(st.pricing, untaken, generation, untaken_warm, cold)
        cost_after = charge(st.pricing, st.total_gpus, preparation + learning) + overlap.billed
        cost = cost_generation + cost_after
        floor = self.floor(prompts)
        ratios = floor.ratios(generation, cost_generation)
        return StepResult(
            step=step,
            time=total,
            generation=generation,
            preparation=preparation,
            learning=learning,
            cost=cost,
            cost_generation=cost_generation,
            n_actors=len(runs),
            actor_gpus=float(np.mean([r.gpus for r in runs])),
            migrations=sum(gen.migrations for gen in gens),
            prefill_tokens=int(plan.prefill["tokens_computed"]),
            prefill_unique=int(plan.prefill["tokens_unique"]),
            prefill_tree_ratio=float(plan.prefill["tree_ratio"]),
            plan_seconds=plan.plan_seconds,
            predicted_time=plan.predicted_time,
            predicted_cost=plan.predicted_cost,
            predicted_step_time=plan.predicted_step_time,
            predicted_step_cost=plan.predicted_step_cost,
            tokens=tokens,
            mean_response=float(true.mean()),
            actors=[
                {
                    "gpus": r.gpus,
                    "node": r.node,
                    "colocated": r.colocated,
                    "ready": r.ready,
                    "decoding": r.decoding,
                    "released": r.released,
                    "migrated_in": r.migrated_in,
                    "migrated_out": r.migrated_out,
                    "warm": w,  # kept warm from its release until the learner took it back
                }
                for r, w in zip(runs, warm, strict=True)
            ],
            untaken_gpus=untaken,
            untaken_warm=untaken_warm,
            floor_time=floor.time_s,
            floor_latency=floor.latency_s,
            floor_throughput=floor.throughput_s,
            floor_cost=floor.work_cost,
            generation_over_floor=ratios["time_over_floor"],
            cost_over_floor=ratios["cost_over_floor"],
            forecast_floor_time=float(plan.floor.get("time_s", 0.0)),
            cost_after=cost_after,
            preparation_overlapped=overlap.done_gpu_s / st.total_gpus,
        )

    def overlap(
        self, gens: list[Generation], generation: float, preparation: float, tokens: float
    ) -> Overlap:
        """The preparation that runs during the generation tail (none unless the plan overlaps it);
        `gens`: the generation of each part of the plan."""
        st = self.stage
        work = preparation * st.total_gpus
        if not gens[0].plan.features.get("overlap_preparation") or self.serverful:
            return Overlap(0.0, work, 0.0)
        g = gens[0].group_size
        per_sequence = np.concatenate([gen.true + gen.prompt_len for gen in gens])
        per_group = per_sequence.reshape(-1, g).sum(axis=1) * (work / tokens)
        finish = np.concatenate([gen.finish for gen in gens]).reshape(-1, g).max(axis=1)
        # Each released actor's GPUs take the reference weights first; GPUs no actor held too.
        runs = [r for gen in gens for r in gen.runs]
        free = []
        for r in runs:
            load = float(st.cluster.transfer_seconds(st.model.weight_bytes, r.node == 0, r.gpus))
            free.append(FreeGpus(r.released + load, float(r.gpus), load))
        unused = st.total_gpus - sum(r.gpus for r in runs)
        if unused > 0:
            load = float(st.cluster.transfer_seconds(st.model.weight_bytes, True, st.profile.gpus))
            free.append(FreeGpus(load, float(unused), load))
        return overlap_preparation(finish, per_group, free, generation, st.pricing)

    def floor(self, prompts: StepPrompts) -> Floor:
        """The step's generation floor from its true lengths, on the cluster's actors."""
        st = self.stage
        g = prompts.lengths.shape[1]
        unique = tree_tokens(PackedPrompts.pack(prompts.prompt_tokens))
        return generation_floor(
            [(p, st.cluster.max_actors(p.gpus)) for p in st.every_profile()],
            np.repeat(prompts.prompt_lengths, g),
            prompts.lengths.ravel(),
            unique,
            st.pricing,
        )


def pilot_seconds(profile: Profile, prompt_tokens: np.ndarray, lengths: np.ndarray) -> float:
    """How long one actor takes to sample the length pilot: its prompts prefilled once, then their
    samples (`lengths`: prompts x G) decoded together under continuous batching
    (`sim.execution.schedule`, as every simulated decode actor)."""
    context = np.repeat(np.asarray(prompt_tokens, dtype=float), lengths.shape[1])
    remaining = lengths.ravel().astype(float)
    cap = slot_cap(profile, context, remaining)
    decode = schedule(profile, 0.0, np.arange(remaining.size), context, remaining, cap).end_time
    return decode + float(profile.prefill_seconds(float(np.sum(prompt_tokens))))
