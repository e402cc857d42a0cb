"""Held-out validation between steps: the policy as it stands, on prompts it never trains on,
sampled as `validation.` says (greedy by default, as VERL's `val_kwargs`) and scored by the run's
own reward.

Under the Ray executor the held-out set decodes on decode functions by default
(`validation.engine=functions`), as VERL validates on its rollout workers: the planner sizes and
places them for the held-out prompts as it does a step's generation, and the meter bills them
with the learner's resources (`cost/validation`). Otherwise it decodes on the learner's engine
(the driver's), which needs no function started and no weights moved, billed as the learner's
units under Ray; one engine's time grows with the held-out set however large the cluster."""

from __future__ import annotations

import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rlhfless.config import Config
from rlhfless.data import DataError, Prompt, load_validation_prompts
from rlhfless.engine import Engine, PrefixTree, SamplingParams, rollout
from rlhfless.planner.pricing import charge
from rlhfless.rewards import RewardFn
from rlhfless.runtime.executor import score
from rlhfless.runtime.samples import Sample, StepPrompt, canonical, decoded, rollout_metrics

# The sampling key's step of every validation: apart from training steps' (>= 1) and the length
# pilot's (`run_forecast.PILOT_STEP`, -1). One for all validations: with a temperature, each draws
# the same noise, so that the held-out curve moves with the policy, not with the draw.
VALIDATION_STREAM = -2


@dataclass
class Decoded:
    """Held-out responses decoded elsewhere than on the learner's engine: the samples, figures of
    how (`cost`, `actors`, ...), and what the run directory keeps of it, by folder under
    `validation/` (`plans`: its plan, `timeline`: its functions and transfers)."""

    samples: list[Sample]
    figures: dict[str, float]
    files: dict[str, dict] = field(default_factory=dict)


@dataclass
class Validation:
    """One validation: its metrics line (`val/...`, `time/validation`, ...), one record per
    response, and the files `Decoded` keeps."""

    metrics: dict[str, float]
    records: list[dict]
    files: dict[str, dict] = field(default_factory=dict)


# (prompts, sampling, responses per prompt, key step) -> the responses, decoded elsewhere
Decode = Callable[[list[StepPrompt], SamplingParams, int, int], Decoded]


def on_functions(cfg: Config) -> bool:
    """Whether held-out prompts decode on decode functions (`validation.engine`)."""
    return cfg.runtime.executor == "ray" and cfg.validation.engine == "functions" and not cfg.validation.only


def shared_prefix(prompts: list[StepPrompt]) -> PrefixTree | None:
    """One prefix level: the tokens every held-out prompt starts with (the system prompt and the
    chat template's header), prefilled once; None when they share none (or there is one prompt)."""
    ids = [p.prompt_ids for p in prompts]
    if len(ids) < 2:
        return None
    end = len(os.path.commonprefix(ids))
    end = min(end, min(map(len, ids)) - 1)  # each prompt keeps a token of its own to prefill
    if end < 1:
        return None
    return PrefixTree([list(ids[0][:end])], [-1], {p.uid: 0 for p in prompts})


class Validator:
    """Scores the held-out `prompts` at the steps `validation_steps` names: decoded by `decode`
    where given (decode functions), else on the learner's engine (its weights are the policy's at
    every call)."""

    def __init__(
        self,
        cfg: Config,
        prompts: list[StepPrompt],
        engine: Engine,
        tokenizer,
        reward_fn: RewardFn,
        decode: Decode | None = None,
    ) -> None:
        """`decode`: where the responses are generated (None: on `engine`)."""
        self.cfg, self.prompts, self.engine, self.decode = cfg, prompts, engine, decode
        self.tokenizer, self.reward_fn = tokenizer, reward_fn
        val = cfg.validation
        self.params = SamplingParams(
            max_new_tokens=cfg.generation.max_new_tokens,
            temperature=val.temperature,
            top_p=cfg.generation.top_p,
            seed=cfg.seed,
        )
        self.tree = shared_prefix(prompts)

    def run(self, step: int) -> Validation:
        """The held-out set decoded and scored once, on the policy as it stands."""
        start = time.perf_counter()
        n = self.cfg.validation.samples
        figures: dict[str, float] = {}
        files: dict[str, dict] = {}
        if self.decode is not None:
            out = self.decode(self.prompts, self.params, n, VALIDATION_STREAM)
            samples, figures, files = out.samples, dict(out.figures), out.files
        else:
            self.engine.model.eval()
            work = [(p.uid, p.prompt_ids) for p in self.prompts]
            results, _ = rollout(self.engine, work, n, self.params, VALIDATION_STREAM, self.tree)
            samples = canonical(decoded(results, self.tokenizer))
        score(self.prompts, samples, self.reward_fn)
        seconds = time.perf_counter() - start
        metrics = {f"val/{k}": v for k, v in validation_metrics(self.prompts, samples).items()}
        metrics["time/validation"] = seconds
        if "cost" in figures:  # metered: the functions, the learner's resources, warm ones idle
            metrics["cost/validation"] = figures.pop("cost")
        elif self.cfg.runtime.executor == "ray":  # where steps are billed: the learner's units
            units = float(self.cfg.scheduler.gpus_per_actor)
            metrics["cost/validation"] = float(charge(self.cfg.scheduler.pricing, units, seconds))
        metrics |= {f"validation/{k}": v for k, v in figures.items()}
        return Validation(metrics, records(self.prompts, samples, step), files)


def held_out_prompts(cfg: Config, training: list[Prompt]) -> list[Prompt]:
    """The validation set (none where the run validates nothing); one left empty is refused."""
    if not cfg.validation.enabled:
        return []
    prompts = load_validation_prompts(cfg.data, cfg.validation.path, cfg.validation.size, training)
    if not prompts:
        raise DataError(
            f"validation.size: every one of the {cfg.validation.size} held-out prompts drawn is a "
            "training prompt too; expected tasks with more distinct questions, or a validation.path"
        )
    return prompts


def validation_steps(cfg: Config, start: int) -> list[int]:
    """The steps a run going on from step `start` validates after (0: the initial policy, where
    the run starts and `validation.before_train`); none with `validation.every=0`."""
    every, last = cfg.validation.every, cfg.trainer.steps
    if not every:
        return []
    first = [0] if start == 0 and cfg.validation.before_train else []
    return first + [s for s in range(start + 1, last + 1) if s % every == 0 or s == last]


def validation_metrics(prompts: list[StepPrompt], samples: list[Sample]) -> dict[str, float]:
    """The rollout curves, each data source's mean reward (`source/<data_source>`, VERL's
    test_score per source), the held-out set's size and, with several responses per prompt,
    `reward/best@N`: the mean over prompts of their best response's reward."""
    out = rollout_metrics(samples) | {"prompts": float(len(prompts))}
    source = {p.uid: p.prompt.data_source for p in prompts}
    by_source: dict[str, list[float]] = defaultdict(list)
    by_prompt: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        by_source[source[s.uid]].append(s.reward)
        by_prompt[s.uid].append(s.reward)
    for name in sorted(by_source):
        out[f"source/{name}"] = statistics.fmean(by_source[name])
    n = max(map(len, by_prompt.values()))
    if n > 1:
        out[f"reward/best@{n}"] = float(np.mean([max(r) for r in by_prompt.values()]))
    return out


def records(prompts: list[StepPrompt], samples: list[Sample], step: int) -> list[dict]:
    """What `validation/step_NNNNNN.jsonl` holds: each response with its prompt and reward."""
    by_uid = {p.uid: p for p in prompts}
    return [
        {
            "step": step,
            "uid": s.uid,
            "sample": s.sample,
            "data_source": by_uid[s.uid].prompt.data_source,
            "prompt": by_uid[s.uid].text,
            "response": s.response,
            "response_tokens": len(s.response_ids),
            "reward": s.reward,
            "reward_components": s.reward_components,
            "finish_reason": s.finish_reason,
        }
        for s in samples
    ]
