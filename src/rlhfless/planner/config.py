"""The `scheduler.` config section: which policy plans each step, and its knobs."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhfless.checks import check
from rlhfless.planner import pilot
from rlhfless.planner.pricing import Pricing

POLICIES = ("rlhfless", "verl", "rlhfuse")
PREDICTORS = ("ewma", "oracle", "expected", "noisy")
METHODS = ("contiguous", "lpt")
MIGRATIONS = ("auto", "gain", "gather", "paper")
NORMALISATIONS = ("relative", "range")
PREFIX_RULES = ("tree", "paper")
TARGET_MISSES = ("stop", "nearest")


@dataclass
class SchedulerConfig:
    """Planner settings. `verl` and `rlhfuse` ignore the four feature toggles (they fix them)."""

    policy: str = field(
        default="rlhfless",
        metadata={
            "help": "rlhfless (toggles below), verl (N = all, even split, no dedup, no cut) "
            "or rlhfuse (verl plus a global cut-and-migrate)"
        },
    )
    tau: float = field(
        default=0.7,
        metadata={
            "help": "cut an actor once this share of its responses finished (rlhfuse: of all responses)"
        },
    )
    lam: float = field(
        default=0.7,
        metadata={
            "help": "step time against cost, 1 favours time and 0 cost: in actor scaling and in a straggler's migration"
        },
    )
    max_slowdown: float | None = field(
        default=1.0,
        metadata={
            "help": "actor scaling: lam chooses among the N whose predicted generation time, with the "
            "learning phase's wait for its ranks at that N (verl's are resident and wait none), is at most "
            "this many times verl's plan of the same step (every actor, equal prompt counts, no "
            "dedup), timed by the same model and divided by how much further short the run's "
            "forecasts lately fell than verl's, from the lengths alone (forecast/shortfall); the "
            "fastest N when none is (lam's among those within 0.5% of it, a tie no forecast resolves); "
            "null = among all. 0.98 adds a fixed margin, at less saving"
        },
    )
    normalise: str = field(
        default="relative",
        metadata={
            "help": "actor scaling: relative (T/T_min - 1 and C/C_min - 1: lam weighs percentages) or "
            "range (the paper's (x - min)/(max - min), which inflates a 2% cost spread to 1)"
        },
    )
    ewma_window: int = field(default=1, metadata={"help": "length predictor: observations per prompt kept"})
    n_min: int = field(default=1, metadata={"help": "fewest decode actors considered"})
    n_max: int | None = field(
        default=None, metadata={"help": "most decode actors considered; null = as many as the cluster holds"}
    )
    gpus_per_actor: int = field(
        default=1, metadata={"help": "GPUs per decode actor (its tensor parallelism)"}
    )
    prefill_capacity: int = field(
        default=256,
        metadata={
            "help": "B_prefill: most shared prefixes the prefill actor computes (paper: distinct "
            "prefixes of the chosen length; tree: the deepest shared prefixes, at most this many "
            "runs of them in sorted order, so no level's forward is wider)"
        },
    )
    price_per_gpu_hour: float = field(
        default=1.95,
        metadata={"help": "rho, USD per accelerator unit-hour (a GPU, or the CPU slot standing in for one)"},
    )
    bill_cold_start: bool = field(
        default=True,
        metadata={"help": "pricing: a function's start-up is billed (serverless GPU platforms do)"},
    )
    bill_keep_alive: bool = field(
        default=True,
        metadata={
            "help": "pricing: a released function kept warm is billed while idle, since it holds its "
            "resources (serverless GPU platforms do); the planner then stops a function at release "
            "unless its next use is nearer than a cold start is worth"
        },
    )
    budget_per_step: float | None = field(
        default=None,
        metadata={
            "help": "USD: each step takes the fastest plan whose forecast step cost fits (instead of "
            "lam): its decode functions and, where the learning width is the planner's (Ray "
            "runtime, runtime.learner_width=0), the learning phase's width; a budget below the "
            "cheapest plan is an error naming it; null = lam decides"
        },
    )
    deadline_per_step: float | None = field(
        default=None,
        metadata={
            "help": "seconds: each step takes the cheapest plan whose forecast step time fits "
            "(instead of lam), decode functions and learning width as under budget_per_step; a "
            "deadline below the fastest plan is an error naming it; null = lam"
        },
    )
    target_miss: str = field(
        default="stop",
        metadata={
            "help": "a step no plan fits the budget or deadline for (its forecast, once the run has "
            "started): stop (the run ends with a one-line error naming the nearest plan; its last "
            "checkpoint stays) or nearest (the step takes that plan, the cheapest or the fastest, "
            "says so in one warning line and records target/missed = 1). A target that even the "
            "run's optimistic forecast misses stops it before it starts, either way"
        },
    )
    dedup_prefill: bool = field(default=True, metadata={"help": "rlhfless: prefill shared prefixes once"})
    prefix_rule: str = field(
        default="tree",
        metadata={
            "help": "dedup: tree (a prefix tree over the step's prompts: every shared prefix's "
            "tokens once, each level from its parent's KV, then each prompt's own part once) or "
            "paper (the largest L whose D(L) distinct L-prefixes fit prefill_capacity, each from "
            "scratch: a system prompt is computed once per group)"
        },
    )
    sorted_assignment: bool = field(
        default=True,
        metadata={"help": "rlhfless: split prompts sorted by predicted length (else even split)"},
    )
    assignment_method: str = field(
        default="contiguous",
        metadata={
            "help": "sorted assignment: contiguous (balanced by predicted work) or lpt (for comparison)"
        },
    )
    balance_rounds: int = field(
        default=1,
        metadata={
            "help": "sorted assignment: rounds that re-split the ranges to equal predicted time "
            "(an actor of long sequences is slower than its work says; on paper-sim a second round moves "
            "generation by under 1% and costs the planner ~10 ms); 0 = the paper's equal work"
        },
    )
    refine_rounds: int = field(
        default=8,
        metadata={
            "help": "sorted assignment: more balance rounds for the chosen N alone (cheap: one N's "
            "ranges), until its actors' predicted times are within 0.5%, where its actors run in "
            "waves; 0 = none"
        },
    )
    backfill: bool = field(
        default=True,
        metadata={
            "help": "sorted assignment: prompts short enough to run in several waves on an actor "
            "(predicted max under the steps an actor's share takes at its full batch) are spread so "
            "that each actor gets a mix of them, whose short ones backfill the slots its long ones "
            "leave (else every actor gets a run of similar lengths)"
        },
    )
    overlap_preparation: bool = field(
        default=True,
        metadata={
            "help": "rlhfless: a group is scored and its reference forward run once all its samples "
            "finished, on capacity the decode actors released, while stragglers decode (strictly "
            "on-policy: nothing trained changes); the simulator models it (with the critic's "
            "forward), the Ray runtime runs it on the learner's prepare function or a finished "
            "decode function (the in-process executor prepares after generation)"
        },
    )
    learn_ahead: bool = field(
        default=False,
        metadata={
            "help": "rlhfless, with a group-local estimator (grpo, rloo) and one update a step: the "
            "learning phase's first extra rank starts during generation once a scored group can be "
            "learned before it ends, and computes scored groups' gradients while stragglers decode; "
            "the update sums them with the rest. Shorter steps, but the update equals the one "
            "without it only within float rounding (sums in another order), so a later step's "
            "sample can differ where two tokens nearly tie: off by default, which keeps every "
            "sample bitwise what any other schedule draws. The Ray runtime runs it; the simulator "
            "does not model it"
        },
    )
    longest_first: bool = field(
        default=True,
        metadata={
            "help": "rlhfless: each actor admits its sequences longest predicted first, so short ones "
            "backfill the tail (else in assignment order)"
        },
    )
    probe_admission: bool = field(
        default=False,
        metadata={
            "help": "rlhfless: an actor holding more sequences than it decodes at once admits one "
            "sample of every prompt first, then each free slot takes the queued sample whose "
            "prompt's running and finished samples say it is longest (planner.admission)"
        },
    )
    actor_scaling: bool = field(
        default=True, metadata={"help": "rlhfless: choose N by time/cost (else N = n_max)"}
    )
    split_sizes: bool = field(
        default=True,
        metadata={
            "help": "actor scaling over several decode actor sizes (the simulator's model.decode_tp, "
            "rlhfless plan --decode-tp): a step may also be split, its longest predicted prompts on "
            "actors of a larger size (on whole nodes, or within the learner's node where the rest "
            "run at the best single size) and the rest on a smaller one, where that beats every "
            "single size with its generation stretched by how much further short of their forecasts "
            "the run's splits fell than the best single size (under budget_per_step or "
            "deadline_per_step, its parts planned at lams from 0 to 1, so the target chooses among "
            "splits as among N)"
        },
    )
    cut_and_migrate: bool = field(
        default=True, metadata={"help": "rlhfless: cut actors at tau and migrate their stragglers"}
    )
    migration: str = field(
        default="gain",
        metadata={
            "help": "per-actor cut: auto (gather while every actor holds no more sequences than it "
            "decodes at once, where a receiver's step is bound by reading its weights; else gain), gain (a straggler moves once, only where it finishes sooner, "
            "resume and the receiver's slowdown counted, and the move is worth it by lam; needs the time table), gather (a cut "
            "actor's stragglers all move, or none, where they fit without ending after the step's "
            "predicted end, and the emptied actor is released) or paper (every straggler to the "
            "least-loaded actor with a free slot)"
        },
    )
    predictor: str = field(
        default="ewma",
        metadata={
            "help": "length predictor: ewma (a seen prompt's history, counted by what histories "
            "have lately added to their source's estimate of the next step's lengths), noisy (its "
            "history times a log-normal factor), or, in the "
            "simulator only, oracle (told the true lengths) or expected (told each prompt's expected "
            "group max and mean: a synthetic workload's)"
        },
    )
    noise: float = field(
        default=0.5, metadata={"help": "noisy predictor: sigma of the log-normal factor on each prediction"}
    )
    seed: int = field(default=0, metadata={"help": "noisy predictor: random seed"})
    default_length: int = field(
        default=256, metadata={"help": "predicted length for a prompt with no history and no answer"}
    )
    answer_length_factor: float = field(
        default=1.0,
        metadata={
            "help": "first epoch, a prompt naming no data source: predicted length = answer tokens x "
            "this factor (a named source learns its own ratio from its groups, and uses answers only "
            "where they fit its responses)"
        },
    )
    length_pilot: int = field(
        default=1,
        metadata={
            "help": "before the first step (and in `plan --run`), sample at least this many prompts "
            "of each data source G times on the learner (not trained on, not in the steps' time or "
            "cost: forecast.json reports its seconds and cost; cached for the same model, prompts "
            "and sampling settings) so that the length predictor and the run's forecast start from "
            "the sources' real lengths, and from their answers' where "
            f"{pilot.ANSWER_GROUPS} prompts or more show that answers fit; at least {pilot.JUDGED} on "
            f"a cluster of more decode actors than that; up to {pilot.MOST} where the profile decodes "
            f"them at most {pilot.SLOWER}x the asked-for step time (a GPU bound by reading its "
            "weights; planner.pilot); 0 = start from default_length, whose guess put the default "
            "run's forecast 45% high"
        },
    )
    segments: int = field(
        default=16, metadata={"help": "time model resolution: length segments for the batch-shrink estimate"}
    )

    def __post_init__(self) -> None:
        check(self.policy in POLICIES, "policy", self.policy, f"one of {', '.join(POLICIES)}")
        check(self.predictor in PREDICTORS, "predictor", self.predictor, f"one of {', '.join(PREDICTORS)}")
        check(
            self.assignment_method in METHODS,
            "assignment_method",
            self.assignment_method,
            f"one of {', '.join(METHODS)}",
        )
        check(
            self.prefix_rule in PREFIX_RULES,
            "prefix_rule",
            self.prefix_rule,
            f"one of {', '.join(PREFIX_RULES)}",
        )
        check(
            self.target_miss in TARGET_MISSES,
            "target_miss",
            self.target_miss,
            f"one of {', '.join(TARGET_MISSES)}",
        )
        check(self.migration in MIGRATIONS, "migration", self.migration, f"one of {', '.join(MIGRATIONS)}")
        check(
            self.normalise in NORMALISATIONS,
            "normalise",
            self.normalise,
            f"one of {', '.join(NORMALISATIONS)}",
        )
        check(0 < self.tau <= 1, "tau", self.tau, "a number in (0, 1]")
        check(0 <= self.lam <= 1, "lam", self.lam, "a number in [0, 1]")
        check(
            self.max_slowdown is None or self.max_slowdown > 0,
            "max_slowdown",
            self.max_slowdown,
            "null or a number > 0",
        )
        check(self.ewma_window >= 1, "ewma_window", self.ewma_window, "an integer >= 1")
        check(self.n_min >= 1, "n_min", self.n_min, "an integer >= 1")
        check(
            self.n_max is None or self.n_max >= self.n_min,
            "n_max",
            self.n_max,
            f"null or an integer >= n_min ({self.n_min})",
        )
        check(self.gpus_per_actor >= 1, "gpus_per_actor", self.gpus_per_actor, "an integer >= 1")
        check(self.prefill_capacity >= 1, "prefill_capacity", self.prefill_capacity, "an integer >= 1")
        check(self.price_per_gpu_hour >= 0, "price_per_gpu_hour", self.price_per_gpu_hour, "a number >= 0")
        check(
            self.budget_per_step is None or self.budget_per_step > 0,
            "budget_per_step",
            self.budget_per_step,
            "null or USD > 0",
        )
        check(
            self.deadline_per_step is None or self.deadline_per_step > 0,
            "deadline_per_step",
            self.deadline_per_step,
            "null or seconds > 0",
        )
        check(
            self.budget_per_step is None or self.deadline_per_step is None,
            "deadline_per_step",
            self.deadline_per_step,
            "null when budget_per_step is set (one target at a time)",
        )
        check(self.noise >= 0, "noise", self.noise, "a number >= 0")
        check(self.default_length >= 1, "default_length", self.default_length, "an integer >= 1")
        check(
            self.answer_length_factor > 0,
            "answer_length_factor",
            self.answer_length_factor,
            "a number > 0",
        )
        check(self.length_pilot >= 0, "length_pilot", self.length_pilot, "an integer >= 0")
        check(self.segments >= 1, "segments", self.segments, "an integer >= 1")
        check(self.balance_rounds >= 0, "balance_rounds", self.balance_rounds, "an integer >= 0")
        check(self.refine_rounds >= 0, "refine_rounds", self.refine_rounds, "an integer >= 0")

    @property
    def pricing(self) -> Pricing:
        return Pricing(self.price_per_gpu_hour, self.bill_cold_start, self.bill_keep_alive)

    @property
    def features(self) -> dict[str, bool | str | int]:
        """What the policy actually does: the toggles for rlhfless, fixed values for the baselines."""
        if self.policy == "rlhfless":
            return {
                "dedup_prefill": self.dedup_prefill,
                "prefix_rule": self.prefix_rule if self.dedup_prefill else "none",
                "sorted_assignment": self.sorted_assignment,
                "balance_rounds": self.balance_rounds if self.sorted_assignment else 0,
                "backfill": self.backfill and self.sorted_assignment,
                "longest_first": self.longest_first,
                "probe_admission": self.probe_admission,
                "actor_scaling": self.actor_scaling,
                "split_sizes": self.split_sizes and self.actor_scaling,
                "cut": "actor" if self.cut_and_migrate else "none",
                "migration": self.migration if self.cut_and_migrate else "none",
                "overlap_preparation": self.overlap_preparation,
                "learn_ahead": self.learn_ahead,
            }
        return {
            "dedup_prefill": False,
            "prefix_rule": "none",
            "sorted_assignment": False,
            "balance_rounds": 0,
            "backfill": False,
            "longest_first": False,
            "probe_admission": False,
            "actor_scaling": False,
            "split_sizes": False,
            "cut": "global" if self.policy == "rlhfuse" else "none",
            "migration": "global" if self.policy == "rlhfuse" else "none",
            "overlap_preparation": False,
            "learn_ahead": False,
        }
