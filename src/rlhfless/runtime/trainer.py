"""The synchronous training loop: plan -> generate -> prepare -> learn, one step at a time.

Reads top to bottom. Everything that decides *where and when* work runs is the planner's; every
phase runs through an executor; this loop only moves data between them and records the step.
"""

from __future__ import annotations

import copy
import json
import random
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlhfless.algo import AdaptiveKLController, FixedKLController, kl_penalty
from rlhfless.algo.config import AlgorithmConfig
from rlhfless.config import Config, resolve_output_dir, save_config, to_dict
from rlhfless.data import Prompt, PromptLoader, load_prompts
from rlhfless.devices import learner_device, resolve_device
from rlhfless.faults import exit_after
from rlhfless.files import write_atomic
from rlhfless.inputs import check_writable
from rlhfless.models import load_model, load_tokenizer
from rlhfless.planner import LengthPredictor
from rlhfless.planner.scaling import PlanError
from rlhfless.rewards import build_reward_fn, check_scorable
from rlhfless.runtime.checkpoint import list_checkpoints, load_checkpoint, resumes, save_checkpoint
from rlhfless.runtime.executor import Executor, InProcessExecutor, build_engine
from rlhfless.runtime.plan_metrics import observe_lengths, plan_metrics
from rlhfless.runtime.planning import build_planner
from rlhfless.runtime.returns import advantages, token_rewards, whiten_tokens
from rlhfless.runtime.run_forecast import start_forecast
from rlhfless.runtime.run_inputs import check_prompts, load_inputs
from rlhfless.runtime.runlog import RunLog
from rlhfless.runtime.samples import Sample, StepPrompt, rollout_metrics
from rlhfless.runtime.validation import Validator, held_out_prompts, on_functions, validation_steps
from rlhfless.runtime.validation_functions import FunctionsDecode

PHASES = ("plan", "generate", "prepare", "learn")


class TrainError(RuntimeError):
    """A problem in the run's inputs found while training (bad prompt, missing checkpoint)."""


@dataclass
class TrainResult:
    output_dir: Path
    history: list[dict] = field(default_factory=list)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def tokenize_prompts(prompts: list[Prompt], tokenizer, max_tokens: int) -> list[StepPrompt]:
    out = []
    for p in prompts:
        text = tokenizer.apply_chat_template(p.messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > max_tokens:
            raise TrainError(
                f"generation.max_prompt_tokens: prompt {p.uid} ({p.data_source}) has {len(ids)} tokens, "
                f"more than {max_tokens}"
            )
        out.append(StepPrompt(p, text, ids))
    return out


def answer_lengths(prompts: list[StepPrompt], tokenizer) -> list[int | None]:
    """Token count of each prompt's ground-truth answer (the predictor's stand-in where it fits)."""
    return [
        len(tokenizer(p.prompt.ground_truth)["input_ids"]) if p.prompt.ground_truth else None for p in prompts
    ]


def kl_controller(algo: AlgorithmConfig) -> FixedKLController | AdaptiveKLController:
    """The KL-in-reward coefficient beta, starting at `kl_coef`."""
    if algo.kl_ctrl == "adaptive":
        return AdaptiveKLController(algo.kl_coef, algo.target_kl, algo.kl_horizon)
    return FixedKLController(algo.kl_coef)


def rollout_records(
    samples: list[Sample], prompts: list[StepPrompt], predicted: dict[str, float]
) -> list[dict]:
    text = {p.uid: p.text for p in prompts}
    return [
        {
            "uid": s.uid,
            "sample": s.sample,
            "prompt": text[s.uid],
            "prompt_ids": s.prompt_ids,
            "response": s.response,
            "response_tokens": len(s.response_ids),
            "reward": s.reward,
            "finish_reason": s.finish_reason,
            "predicted_length": predicted.get(s.uid),
        }
        for s in samples
    ]


def build_executor(cfg: Config, tokenizer, policy: torch.nn.Module) -> Executor:
    reference = None
    if cfg.algorithm.kl_coef > 0:
        reference = copy.deepcopy(policy).eval().requires_grad_(False)
    if cfg.runtime.executor == "ray":
        from rlhfless.runtime.ray_executor import RayExecutor  # Ray starts only when asked for

        return RayExecutor(cfg, policy, reference, tokenizer, build_reward_fn(cfg.reward))
    return InProcessExecutor(cfg, policy, reference, tokenizer, build_reward_fn(cfg.reward))


def _refuse_a_trained_run(out: Path, checkpoints: list[Path]) -> None:
    """A new run never writes over one that trained (`checkpoints`: its directory's): its metrics
    and checkpoints would be lost (and the new run's first checkpoint pruned as the oldest)."""
    metrics = out / "metrics.jsonl"
    if checkpoints:
        raise TrainError(
            f"output_dir: {out} holds a trained run (checkpoints to {checkpoints[-1].name}); expected "
            "a new directory, or --resume (resume=true, or resume=auto) to continue that run"
        )
    if metrics.is_file() and metrics.stat().st_size:
        raise TrainError(
            f"output_dir: {out} holds a trained run's metrics and no checkpoint to resume from; "
            "expected a new directory"
        )


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal: `args[0]` names it (SIGINT: Ctrl-C; SIGTERM: `ray job stop`, a
    scheduler's preemption). What its last checkpoint holds resumes."""


@contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """SIGTERM stops the run as Ctrl-C does, through its `finally` blocks (the executor closed, the
    logs flushed), where Python's default would kill the driver outright, and is told apart. Only
    in the main thread, where Python handles signals; the caller's handler is put back after."""
    received = ["SIGINT"]

    def on_term(signum: int, frame: Any) -> None:
        received[0] = "SIGTERM"
        raise KeyboardInterrupt

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_term) if main else None
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted(received[0]) from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def train(cfg: Config, on_event: Callable[[str, dict], None] = lambda kind, info: None) -> TrainResult:
    """Run `cfg.trainer.steps` synchronous steps; `on_event` feeds progress displays. A SIGINT or
    SIGTERM stops it with `Interrupted`."""
    with _stopped_by_signals():
        return _train(cfg, on_event)


def _train(cfg: Config, on_event: Callable[[str, dict], None]) -> TrainResult:
    cfg = resolve_device(cfg)  # chosen once: every model of the run goes there
    out = resolve_output_dir(cfg)
    check_writable(out, "output_dir")  # before anything loads
    checkpoints = list_checkpoints(out / "checkpoints")
    resuming = resumes(cfg.resume, checkpoints)
    if resuming and not checkpoints:
        raise TrainError(f"resume: no checkpoint under {out / 'checkpoints'}")
    if not resuming:
        _refuse_a_trained_run(out, checkpoints)
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    seed_everything(cfg.seed)
    if cfg.validation.only:
        return _validate_only(cfg, out, checkpoints[-1] if resuming else None, on_event)
    tokenizer, prompts, held_out, policy = load_inputs(cfg)  # checked before any write
    check_scorable(cfg.reward, prompts + held_out)
    loader = PromptLoader(prompts, cfg.data.batch_size, cfg.seed, cfg.data.shuffle)
    # The planner first: a machine's first run measures its profile here, before the executor
    # holds a reference copy or starts Ray's processes beside the timing.
    planner = build_planner(cfg, policy)
    executor = build_executor(cfg, tokenizer, policy)
    predictor = LengthPredictor.from_config(cfg.scheduler)
    validator = decode = None
    if held_out:
        tokenized = tokenize_prompts(held_out, tokenizer, cfg.generation.max_prompt_tokens)
        answers = answer_lengths(tokenized, tokenizer)
        decode = FunctionsDecode(executor, planner, predictor, answers) if on_functions(cfg) else None
        validator = Validator(cfg, tokenized, executor.engine, tokenizer, build_reward_fn(cfg.reward), decode)

    kl_ctrl = kl_controller(cfg.algorithm)
    start = 0
    if resuming:
        state = load_checkpoint(checkpoints[-1], policy)
        executor.load_state(checkpoints[-1] / "optimizer.pt")
        loader.load_state_dict(state["loader"])
        predictor.load_state_dict(state["predictor"])
        planner.load_state_dict(state.get("planner", {}))
        kl_ctrl.value = state.get("kl_coef", kl_ctrl.value)
        if decode is not None and "validation" in state:  # the held-out lengths measured so far
            decode.load_state_dict(state["validation"])
        start = state["step"]
    on_event("forecasting", {"steps": cfg.trainer.steps - start})
    try:  # before anything is written: an infeasible budget or deadline stops the run here
        forecast = start_forecast(
            cfg,
            prompts,
            held_out,
            tokenizer,
            planner,
            predictor,
            executor.engine,
            start,
            executor.warm_up,
            executor.host_starting_s,
        )
    except PlanError as err:
        executor.close()
        raise TrainError(f"forecast: {err}") from None
    try:
        log = _run_log(cfg, out, start)
    except TrainError:
        executor.close()
        raise
    if start == 0:  # a resumed run keeps the forecast made before it paid anything
        write_atomic(out / "forecast.json", json.dumps(forecast, indent=1))
    on_event("forecast", forecast)
    result = TrainResult(out)
    on_event("start", {"output_dir": str(out), "start": start, "steps": cfg.trainer.steps})
    try:
        validating = set(validation_steps(cfg, start)) if validator is not None else set()
        if 0 in validating:
            validate(validator, 0, log, on_event)
        for step in range(start + 1, cfg.trainer.steps + 1):
            metrics = run_step(
                cfg, step, next(loader), tokenizer, planner, predictor, executor, log, on_event, kl_ctrl
            )
            log.metrics(step, metrics)
            result.history.append({"step": step, **metrics})
            on_event("step", {"step": step, **metrics})
            if step in validating:  # before its checkpoint, as VERL
                validate(validator, step, log, on_event)
            if (cfg.trainer.save_every and step % cfg.trainer.save_every == 0) or step == cfg.trainer.steps:
                trainer_state = {
                    "loader": loader.state_dict(),
                    "predictor": predictor.state_dict(),
                    "planner": planner.state_dict(),
                    "kl_coef": kl_ctrl.value,
                }
                if decode is not None:
                    trainer_state["validation"] = decode.state_dict()
                save_checkpoint(
                    out / "checkpoints",
                    step,
                    policy,
                    trainer_state,
                    executor.save_state,
                    cfg.trainer.keep_checkpoints,
                    exit_after(cfg.runtime.fault_plan.checkpoint_file(step)),
                )
    finally:
        log.close()
        executor.close()
    write_summary(out, log.rows(), log.validations())
    return result


def _run_log(cfg: Config, out: Path, resumed_at: int = 0, config: bool = True) -> RunLog:
    """The run directory made, its config written (unless `config` is false) and its log opened."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # what `check_writable` cannot see (a path under /proc, a full disk)
        raise TrainError(f"output_dir: {out}: cannot be made ({err.strerror})") from None
    if config:
        save_config(cfg, out / "config.yaml")
    wandb = cfg.trainer.wandb_project if cfg.trainer.wandb else None
    return RunLog(out, cfg.trainer.tensorboard, wandb, to_dict(cfg), resumed_at=resumed_at)


def _validate_only(
    cfg: Config, out: Path, checkpoint: Path | None, on_event: Callable[[str, dict], None]
) -> TrainResult:
    """`validation.only`: the policy (as it loads, or `checkpoint`'s) scored once on the held-out
    set, in this process on an engine that decodes; no planner, function or step. A new
    `output_dir` gets the config; a run's own keeps its."""
    tokenizer = load_tokenizer(cfg.model)
    held_out = held_out_prompts(cfg, load_prompts(cfg.data))
    policy = load_model(cfg.model, len(tokenizer), cfg.seed, learner_device(cfg.runtime.device))
    check_prompts(cfg, held_out, tokenizer, policy)
    check_scorable(cfg.reward, held_out)
    step = 0 if checkpoint is None else int(load_checkpoint(checkpoint, policy)["step"])
    prompts = tokenize_prompts(held_out, tokenizer, cfg.generation.max_prompt_tokens)
    engine = build_engine(cfg, policy, tokenizer, decodes=True)
    validator = Validator(cfg, prompts, engine, tokenizer, build_reward_fn(cfg.reward))
    log = _run_log(cfg, out, config=checkpoint is None)
    on_event("start", {"output_dir": str(out), "start": step, "steps": step})
    try:
        validate(validator, step, log, on_event)
    finally:
        log.close()
    return TrainResult(out)


def validate(validator: Validator, step: int, log: RunLog, on_event: Callable[[str, dict], None]) -> None:
    """One validation, recorded: its metrics line, its responses, the display's line."""
    on_event("phase", {"step": step, "phase": "validate"})
    done = validator.run(step)
    log.validation(step, done.metrics)
    log.step_file("validation", step, done.records)
    for folder, payload in done.files.items():
        log.step_file(f"validation/{folder}", step, payload)
    on_event("validation", {"step": step, **done.metrics})


def run_step(
    cfg, step, batch, tokenizer, planner, predictor, executor, log, on_event, kl_ctrl=None
) -> dict[str, float]:
    kl_ctrl = kl_ctrl or kl_controller(cfg.algorithm)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    prompts = tokenize_prompts(batch, tokenizer, cfg.generation.max_prompt_tokens)
    answers = answer_lengths(prompts, tokenizer)

    on_event("phase", {"step": step, "phase": "plan"})
    try:
        plan = planner.plan(
            prompts,
            answers,
            predictor,
            executor.warm_functions(),
            executor.cluster(),
            executor.host_starting_s(),
            first=not planner.observed,
        )
    except PlanError as err:
        raise TrainError(f"step {step}: {err}") from None
    if missed := plan.missed_target():  # `scheduler.target_miss=nearest`: the step takes it
        on_event("warning", {"step": step, "message": f"{missed}; step {step} takes that plan"})

    on_event("phase", {"step": step, "phase": "generate"})
    t = time.perf_counter()
    samples, gen_metrics = executor.generate(prompts, plan, step)
    timings["time/generation"] = time.perf_counter() - t

    on_event("phase", {"step": step, "phase": "prepare"})
    t = time.perf_counter()
    algo = cfg.algorithm
    ref, prep_metrics = executor.prepare(prompts, samples)
    old = rewards = None
    if algo.kl_in_reward:  # the KL is paid in the reward, per token, and not again in the loss
        old = executor.policy_logprobs(samples)
        kl = [kl_penalty(o, r, algo.kl_estimator) for o, r in zip(old, ref, strict=True)]
        rewards = token_rewards(samples, kl, kl_ctrl.value, algo.normalize_reward)
        tokens = sum(k.numel() for k in kl)
        prep_metrics |= {"kl/mean": float(sum(k.sum() for k in kl)) / tokens, "kl/coef": kl_ctrl.value}
        kl_ctrl.update(statistics.fmean(float(k.mean()) for k in kl), len(samples))
        ref = None
    elif algo.name in ("ppo", "reinforce_pp"):
        rewards = token_rewards(samples, None, 0.0, algo.normalize_reward)
    adv = None if algo.name == "ppo" else advantages(cfg, samples, rewards)
    timings["time/preparation"] = time.perf_counter() - t

    on_event("phase", {"step": step, "phase": "learn"})
    t = time.perf_counter()
    learn_metrics = {}
    if algo.name == "ppo":  # the critic learns first: its pre-update values give the advantages
        raw, learn_metrics = executor.critic_update(samples, rewards)
        adv = whiten_tokens(raw)
        timings["time/critic"] = time.perf_counter() - t
    if algo.name != "ppo" or step > algo.critic_warmup:
        given = {} if old is None else {"old": old}  # only when computed: `old` is a later addition
        learn_metrics |= executor.learn(samples, adv, ref, **given)
    timings["time/learning"] = time.perf_counter() - t

    billing, timeline = executor.finish_step(step)
    if timeline is not None:
        log.step_file("timeline", step, timeline)

    quality = observe_lengths(plan, samples, predictor, cfg.generation.max_new_tokens)
    log.step_file("rollouts", step, rollout_records(samples, prompts, plan.predicted_length))
    log.step_file("plans", step, plan.to_dict())
    timings["time/step"] = time.perf_counter() - t0
    metrics = {
        **rollout_metrics(samples),
        **learn_metrics,
        **gen_metrics,
        **prep_metrics,
        **billing,
        **quality,
        **plan_metrics(plan),
        **timings,
    }
    return metrics | planner.observe(plan, samples, metrics)


# Curves whose first and last windows the summary compares: one step of 32 samples is noise.
WINDOWED = ("reward/mean", "loss/value", "value/explained_variance")


def write_summary(out: Path, rows: list[dict], validations: Sequence[dict] = ()) -> None:
    """The whole run's summary from its metrics log's `rows`, steps before a resume included, with the
    mean of each windowed curve over the first and the last `window` steps, and the first and the
    last validation's held-out reward, with what every validation took."""
    if not rows:
        return
    window = max(1, min(10, len(rows) // 2))
    summary = {
        "steps": len(rows),
        "last_step": rows[-1]["step"],
        "mean_step_seconds": statistics.fmean(r["time/step"] for r in rows),
        "first_reward": rows[0]["reward/mean"],
        "last_reward": rows[-1]["reward/mean"],
        "window": window,
    }
    for key in WINDOWED:
        for name, part in (("first", rows[:window]), ("last", rows[-window:])):
            values = [r[key] for r in part if r.get(key) is not None]
            if values:
                summary[f"{name}_window/{key}"] = statistics.fmean(values)
    if all("cost/step" in r for r in rows):
        summary["mean_cost_per_step"] = statistics.fmean(r["cost/step"] for r in rows)
    if validations:
        for name, row in (("first", validations[0]), ("last", validations[-1])):
            summary[f"{name}_validation"] = {"step": row["step"], "val/reward/mean": row["val/reward/mean"]}
        summary["validation_seconds"] = sum(v["time/validation"] for v in validations)
        if all("cost/validation" in v for v in validations):
            summary["validation_cost"] = sum(v["cost/validation"] for v in validations)
    write_atomic(out / "summary.json", json.dumps(summary, indent=1))
