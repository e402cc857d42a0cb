"""What a whole run will take and cost, before paying for it.

The forecast plans every step of the run as training would (same loader order, same planner,
same profile and pricing), without generating or learning. Its inputs are the ones a first step
has: the time table (measured once, cached), the learning phase's seconds per token (measured
once on a small synthetic batch, cached), and the length predictor's first-epoch estimates,
seeded by a short length pilot (`scheduler.length_pilot`, one prompt of each data source by
default, more where the profile decodes them at about the same step time (`planner.pilot`):
sampled once with the real model on the learner, before step 1; nothing is trained on them, and
its seconds and what the learner's slot costs meanwhile are reported apart from the steps'). No
observation comes in while forecasting, so every step is planned on first-epoch estimates: the
range re-plans the run with every predicted length halved and increased by half
(capped at max_new_tokens), and a length guessed from `scheduler.default_length` (a source the
pilot did not sample) from one token up; then its ends scale by how far the machine's speed has
strayed from the forecast's in earlier runs here (`planner.forecast.speed_range`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlhfless.config import Config
from rlhfless.data import Prompt, PromptLoader
from rlhfless.engine import Engine, rollout
from rlhfless.files import write_atomic
from rlhfless.planner import LengthPredictor
from rlhfless.planner.forecast import LENGTH_RANGE, speed_range
from rlhfless.planner.pilot import pilot_context, pilot_prompts
from rlhfless.planner.pricing import charge
from rlhfless.planner.scaling import TARGETS, PlanError
from rlhfless.runtime.executor import build_engine, build_learner, sampling_params
from rlhfless.runtime.machine import Speed, cache_key, learner_threads
from rlhfless.runtime.planning import StepPlanner
from rlhfless.runtime.samples import Sample, StepPrompt
from rlhfless.runtime.validation import on_functions, validation_steps

PILOT_STEP = -1  # the sampling key of pilot responses: no training step uses it


def learning_seconds_per_token(
    policy: torch.nn.Module, cfg: Config, prompt_ids: list[int], speed: Speed | None = None
) -> float:
    """Seconds per prompt + response token of one step's preparation (reference log-probs) and
    learning, timed once on a synthetic batch of 8 samples on a copy of `policy` and cached with
    the machine's speed then (the probe's steps, `speed.now_ms`); a cached rate is scaled to its
    speed now."""
    algo = cfg.algorithm
    recompute = cfg.model.checkpoint_every_n_layers if cfg.model.gradient_checkpointing else 0
    key = f"{cache_key(policy, torch.get_num_threads())}-{cfg.model.compute_dtype}-recompute{recompute}"
    shape = f"{key}-{cfg.trainer.micro_batch_tokens}-{algo.name}-{algo.epochs}-{algo.mini_batches}-{algo.kl_coef > 0}"
    path = (
        Path(cfg.model.cache_dir).expanduser()
        / "profiles"
        / f"learn-{hashlib.sha256(shape.encode()).hexdigest()[:16]}.json"
    )
    if path.is_file():
        try:
            cached = json.loads(path.read_text())
            factor = speed.since(cached.get("probe_ms")) if speed is not None else 1.0
            return float(cached["seconds_per_token"]) * factor
        except (ValueError, KeyError, OSError, TypeError, AttributeError):
            pass  # damaged: measure again
    model = copy.deepcopy(policy).train()
    learner = build_learner(cfg, model, pad_id=0)
    rng = np.random.default_rng(0)
    vocab = int(policy.config.vocab_size)
    length = max(1, cfg.generation.max_new_tokens // 2)
    samples = [
        Sample(f"pilot{i // 4}", i % 4, list(prompt_ids), rng.integers(0, vocab, length).tolist(), "stop")
        for i in range(8)
    ]
    advantages = [torch.full((length,), float(rng.normal())) for _ in samples]
    start = time.perf_counter()
    ref = learner.logprobs(model, samples) if algo.kl_coef > 0 else None
    learner.learn(samples, advantages, ref)
    seconds = time.perf_counter() - start
    del model, learner
    rate = seconds / sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    measured = {"seconds_per_token": rate, "measured_tokens": 8 * (len(prompt_ids) + length)}
    if speed is not None:
        measured["probe_ms"] = list(speed.now_ms)
    write_atomic(path, json.dumps(measured))
    return rate


def _pilot_path(engine: Engine, cfg: Config, picked: list[StepPrompt]) -> Path:
    """Where the pilot of these prompts is kept: its lengths depend on the model, the prompts and
    the sampling settings (seed included), so a second run (`plan --run`, then `train`; or the
    other policy of a benchmark) takes them instead of sampling again."""
    model = engine.model
    gen = cfg.generation
    raw = json.dumps(
        [
            model.config.to_dict(),
            str(next(model.parameters()).dtype),
            [gen.max_new_tokens, gen.temperature, gen.top_p, gen.max_running, cfg.seed],
            cfg.algorithm.group_size,
            [(p.uid, p.prompt_ids) for p in picked],
        ],
        sort_keys=True,
        default=str,
    )
    name = f"pilot-{hashlib.sha256(raw.encode()).hexdigest()[:16]}.json"
    return Path(cfg.model.cache_dir).expanduser() / "profiles" / name


def length_pilot(
    engine: Engine,
    prompts: list[StepPrompt],
    cfg: Config,
    per_source: int,
    predictor: LengthPredictor,
    answers: Callable[[list[StepPrompt]], list[int | None]],
) -> dict[str, float]:
    """Sample `per_source` prompts of each data source G times and teach `predictor` their
    sources' lengths, and with their `answers`' token counts, whether answers stand in for them.
    The pilot's uids are its own (`pilot:<uid>`): the prompts themselves stay unseen, and its
    responses are keyed to no training step. Lengths sampled before for the same model, prompts
    and settings are taken from the cache (`pilot/seconds` 0: nothing ran)."""
    chosen: dict[str, list[StepPrompt]] = {}
    for p in prompts:
        group = chosen.setdefault(p.prompt.data_source, [])
        if len(group) < per_source:
            group.append(p)
    picked = [p for group in chosen.values() for p in group]
    uids = [f"pilot:{p.uid}" for p in picked]
    path = _pilot_path(engine, cfg, picked)
    lengths: dict[str, list[int]] = {}
    if path.is_file():
        try:
            lengths = {u: [int(x) for x in v] for u, v in json.loads(path.read_text())["lengths"].items()}
        except (ValueError, KeyError, TypeError, AttributeError, OSError):
            lengths = {}  # damaged: sample again
    start = time.perf_counter()
    cached = set(uids) <= set(lengths)
    if not cached:
        results, _ = rollout(
            engine,
            [(u, p.prompt_ids) for u, p in zip(uids, picked, strict=True)],
            cfg.algorithm.group_size,
            sampling_params(cfg),
            PILOT_STEP,
            None,
        )
        lengths = {}
        for r in results:
            lengths.setdefault(r.uid, []).append(len(r.response_ids))
        write_atomic(path, json.dumps({"lengths": lengths, "seconds": time.perf_counter() - start}))
    predictor.predict(uids, answers(picked), [p.prompt.data_source for p in picked])  # tells it their sources
    predictor.update_many(uids, [lengths[u] for u in uids])
    seconds = 0.0 if cached else time.perf_counter() - start
    return {"pilot/prompts": float(len(picked)), "pilot/seconds": seconds, "pilot/cached": float(cached)}


@dataclass
class ScaledPredictor:
    """A predictor whose every prediction is scaled by `factor` (the forecast's range ends). A
    length resting on `scheduler.default_length` alone (`LengthPredictor.guessed`) is a guess, not
    an estimate: it becomes `guessed` when that is set (the optimistic end: one token)."""

    base: LengthPredictor
    factor: float
    guessed: float | None = None
    guesses: int = 0

    def predict(self, uids, answer_tokens=None, sources=None) -> tuple[np.ndarray, np.ndarray]:
        gmax, gmean = self.base.predict(uids, answer_tokens, sources)
        gmax, gmean = gmax * self.factor, gmean * self.factor
        if self.guessed is not None:
            mask = self.base.guessed(uids, answer_tokens, sources)
            self.guesses += int(mask.sum())
            gmax, gmean = np.where(mask, self.guessed, gmax), np.where(mask, self.guessed, gmean)
        return gmax, gmean

    @property
    def overrun(self) -> list[float]:
        """The base predictor's: ratios of sample to planned max, which scaling leaves alone."""
        return self.base.overrun

    def tail_ratios(self, uids: Sequence[str]) -> list[float]:
        """The base predictor's: ratios of group max to planned max, which scaling leaves alone."""
        return self.base.tail_ratios(uids)


MISS_SAYS = {"stop": "stops the run", "nearest": "takes the plan nearest to it"}  # `target_miss`


def _target(scheduler) -> tuple[str, float, str, str] | None:
    """(key, value, unit, the plan that meets it best) of the run's budget or deadline, if any."""
    for key, (unit, best) in TARGETS.items():
        if getattr(scheduler, key) is not None:
            return key, getattr(scheduler, key), unit, best
    return None


def forecast_run(
    cfg: Config,
    prompts: list[Prompt],
    tokenize,
    answers,
    planner: StepPlanner,
    predictor: LengthPredictor,
    first_step: int = 1,
    host_starting_s: float | None = None,
) -> dict[str, Any]:
    """Plan steps first_step..cfg.trainer.steps on first-epoch estimates: the run's forecast total
    time and cost, its range, and each step's point forecast. The first step waits what a run's
    first step in its process does: the rest of the start of the decode function on the
    learner's resources, starting for `host_starting_s` now (None: started), and verl's resident
    ranks' start.

    A budget or deadline is refused here (PlanError) only where even the range's optimistic end
    cannot meet it: these first-epoch figures know nothing the run will measure, so a step they
    put past the target is forecast at the plan nearest to it and said in `warning`; each step's
    planner decides at its planning time."""
    target = _target(planner.scheduler)
    missed: list[int] = []
    nearest = copy.copy(planner)  # a step no plan fits is forecast at the plan nearest to it
    nearest.scheduler = replace(planner.scheduler, target_miss="nearest")

    loader = PromptLoader(prompts, cfg.data.batch_size, cfg.seed, cfg.data.shuffle)
    for _ in range(first_step - 1):
        next(loader)
    batches = []  # each step's batch, tokenized once for the three passes below
    for _ in range(first_step, cfg.trainer.steps + 1):
        batch = tokenize(next(loader))
        batches.append((batch, answers(batch)))

    def totals(model, optimistic: bool = False) -> tuple[float, float, list[dict[str, float]]]:
        rows = []
        for step, (batch, answer) in enumerate(batches, start=first_step):
            first = step == first_step
            plan = nearest.plan(
                batch, answer, model, host_starting_s=host_starting_s if first else None, first=first
            )
            if plan.target.get("missed") and optimistic:
                raise PlanError(
                    f"{plan.missed_target()} even at the forecast's optimistic end ({low}), step {step}"
                )
            if plan.target.get("missed") and model is predictor:
                missed.append(step)
            rows.append(
                {
                    "step": step,
                    "time": plan.predicted_step_time,
                    "cost": plan.predicted_step_cost,
                    "generation_time": plan.predicted_time,
                    "n_actors": plan.n_actors,
                    "learner_width": plan.learner_width,
                }
            )
        return sum(r["time"] for r in rows), sum(r["cost"] for r in rows), rows

    optimist = ScaledPredictor(predictor, LENGTH_RANGE[0], guessed=1.0)
    low = f"predicted lengths x {LENGTH_RANGE[0]}, a guessed one 1 token"
    _, _, lows = totals(optimist, optimistic=True)
    time_s, cost, rows = totals(predictor)
    _, _, highs = totals(ScaledPredictor(predictor, LENGTH_RANGE[1]))
    # Each end re-plans its step, and may take another N than the point forecast did (one that is
    # slower at the shorter lengths, where a first step's wait for the learner's decode function
    # weighs more): the range holds the point forecast all the same. Then the machine's speed,
    # which no length varies: its seconds, and the slots billed for them, scale alike.
    scales = planner.memory.scales if planner.memory is not None else []
    faster, slower, speed = speed_range(scales, planner.drift)
    for row, lo, hi in zip(rows, lows, highs, strict=True):
        for key, kept in (("time", "time_range"), ("cost", "cost_range")):
            row[kept] = [min(lo[key], row[key]) * faster, max(hi[key], row[key]) * slower]
    low_t, high_t = (sum(r["time_range"][end] for r in rows) for end in (0, 1))
    low_c, high_c = (sum(r["cost_range"][end] for r in rows) for end in (0, 1))
    span = f"predicted lengths x {LENGTH_RANGE[0]} .. x {LENGTH_RANGE[1]}"
    if optimist.guesses:
        span += f"; {optimist.guesses} lengths guessed from scheduler.default_length (no pilot): 1 token .. x {LENGTH_RANGE[1]}"
    span += f"; {speed}"
    out = {
        "steps": len(rows),
        "first_step": first_step,
        "time_s": time_s,
        "cost": cost,
        "time_range_s": [low_t, high_t],
        "cost_range": [low_c, high_c],
        "range": span,
        "per_step": rows,
    }
    if missed:
        key, value, unit, best = target
        worst = max(r["time" if unit == "s" else "cost"] for r in rows if r["step"] in missed)
        out["target_missed_steps"] = missed
        out["warning"] = (
            f"scheduler.{key}={value:.6g} {unit} may be missed on early steps: the forecast before the "
            f"run puts {len(missed)} of {len(rows)} step(s) past it (the {best} plan up to {worst:.6g} "
            f"{unit}), its optimistic end within it; each step plans with what the run has measured "
            f"by then, and one that no plan fits {MISS_SAYS[planner.scheduler.target_miss]}"
        )
    return out


def validation_forecast(
    cfg: Config,
    held_out: list[StepPrompt],
    answers: Callable[[list[StepPrompt]], list[int | None]],
    planner: StepPlanner,
    predictor: LengthPredictor,
    start: int,
) -> dict[str, float]:
    """The run's validations (`validation_steps` from step `start`), apart from the steps' figures
    as the pilot is: each as its plan on decode functions forecasts it
    (`StepPlanner.plan_validation`), or on the learner's engine as that engine generating the
    held-out set alone (`StepPlanner.alone_seconds`), billed as the learner's units."""
    steps = validation_steps(cfg, start)
    if not steps:
        return {}
    lengths, n = answers(held_out), cfg.validation.samples
    predictor = copy.deepcopy(predictor)  # it records what it is asked: training's records no held-out prompt
    if on_functions(cfg):
        plan = planner.plan_validation(held_out, lengths, predictor, n)
        each_s, each_cost = plan.predicted_time, plan.predicted_cost
    else:
        each_s = planner.alone_seconds(held_out, lengths, predictor, n)
        each_cost = float(charge(cfg.scheduler.pricing, planner.resident_units, each_s))
    return {
        "validation/count": float(len(steps)),
        "validation/seconds": each_s * len(steps),
        "validation/cost": each_cost * len(steps),
    }


def start_forecast(
    cfg: Config,
    prompts: list[Prompt],
    held_out: list[Prompt],
    tokenizer,
    planner: StepPlanner,
    predictor,
    engine: Engine,
    start: int,
    warm_up: Callable[[], None] = lambda: None,
    host_starting: Callable[[], float | None] = lambda: None,
) -> dict[str, Any]:
    """Prime the forecast's inputs (the learning phase's measured rate; the length pilot on a
    fresh run), then the whole run's forecast from step `start + 1`. `warm_up` starts what the
    run's functions need, once the learner's rate is timed (alone, as it is cached) and before
    the pilot and the forecast, which it then overlaps; `host_starting` says how long the decode
    function it started on the learner's resources has been starting. `held_out`: the validation
    set, whose validations are forecast apart (`validation_forecast`)."""
    from rlhfless.runtime.trainer import answer_lengths, tokenize_prompts

    done: dict[str, StepPrompt] = {}  # every epoch holds the same prompts: each is tokenized once
    answer_of: dict[str, int | None] = {}

    def tokenize(batch: list[Prompt]) -> list[StepPrompt]:
        new = list({p.uid: p for p in batch if p.uid not in done}.values())
        done.update((s.uid, s) for s in tokenize_prompts(new, tokenizer, cfg.generation.max_prompt_tokens))
        return [done[p.uid] for p in batch]

    def answers(batch: list[StepPrompt]) -> list[int | None]:
        new = list({s.uid: s for s in batch if s.uid not in answer_of}.values())
        answer_of.update(zip((s.uid for s in new), answer_lengths(new, tokenizer), strict=True))
        return [answer_of[s.uid] for s in batch]

    first = tokenize(prompts[:1])[0].prompt_ids
    if planner.phases.per_token_s is None:
        planner.learned_alone(learning_seconds_per_token(engine.model, cfg, first, planner.speed))
    warm_up()
    pilot = {}
    if cfg.scheduler.length_pilot and start == 0:
        steps = tokenize(prompts)
        context = pilot_context([len(p.prompt_ids) for p in steps], cfg.generation.max_new_tokens)
        actors = planner.cluster.max_actors(planner.profile.gpus)
        per_source = pilot_prompts(
            planner.profile, cfg.scheduler.length_pilot, cfg.algorithm.group_size, context, actors
        )
        pilot = length_pilot(engine, steps, cfg, per_source, predictor, answers)
        # It runs on the learner, whose slot a serverless platform bills meanwhile.
        pilot["pilot/cost"] = charge(cfg.scheduler.pricing, planner.resident_units, pilot["pilot/seconds"])
    forecast = forecast_run(cfg, prompts, tokenize, answers, planner, predictor, start + 1, host_starting())
    if held_out:
        forecast |= validation_forecast(cfg, tokenize(held_out), answers, planner, predictor, start)
    speed = planner.speed
    machine = (
        {"machine/speed": speed.factor, "machine/probe_ms": list(speed.now_ms)} if speed is not None else {}
    )
    if planner.drift is not None:
        machine["memory/speed"] = planner.drift
    return {
        **forecast,
        **pilot,
        **machine,
        # What the time model starts from: steps earlier runs here observed (0: the cached table
        # and learning rate alone, whose speed in the run only its first step measures), and
        # how many runs' decode scales the memory weighs (`run_memory`).
        "memory/steps": float(planner.calibration.steps),
        "memory/runs": float(len(planner.memory.scales) if planner.memory is not None else 0),
        "learning_seconds_per_token": planner.phases.per_token_s,
    }


def forecast_for_config(cfg: Config) -> dict[str, Any]:
    """`rlhfless plan --run`: the whole run's forecast without training (model, data and profile
    loaded as `rlhfless train` would, with the learner's thread count)."""
    from rlhfless.devices import resolve_device
    from rlhfless.runtime.planning import build_planner
    from rlhfless.runtime.run_inputs import load_inputs

    cfg = resolve_device(cfg)
    torch.set_num_threads(learner_threads(cfg))  # as the run's learner
    tokenizer, prompts, held_out, policy = load_inputs(cfg)
    engine = build_engine(cfg, policy, tokenizer)
    planner = build_planner(cfg, policy)
    predictor = LengthPredictor.from_config(cfg.scheduler)
    # Under Ray, training starts the learner's decode function where `warm_up` is called: step 1
    # waits for what is left of its start after the pilot and the forecast.
    begun: list[float] = []

    def starting() -> float | None:
        return time.time() - begun[0] if cfg.runtime.executor == "ray" else None

    return start_forecast(
        cfg,
        prompts,
        held_out,
        tokenizer,
        planner,
        predictor,
        engine,
        0,
        lambda: begun.append(time.time()),
        starting,
    )
