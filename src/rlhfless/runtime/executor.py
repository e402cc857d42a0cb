"""The executor interface the step controller drives, and the in-process executor.

A step is generate -> prepare -> learn. Executors decide where each phase runs (this process, or
Ray functions); they never decide what is trained on: samples come back in canonical order and
are drawn from placement-independent random streams.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch
from torch import Tensor

from rlhfless.config import Config
from rlhfless.engine import Engine, SamplingParams, rollout
from rlhfless.planner import StepPlan
from rlhfless.rewards import RewardFn
from rlhfless.runtime.learner import Learner
from rlhfless.runtime.samples import Sample, StepPrompt, canonical


class Executor(Protocol):
    policy: torch.nn.Module

    def generate(self, prompts: list[StepPrompt], plan: StepPlan, step: int) -> tuple[list[Sample], dict]:
        """All G samples of every prompt, canonical order, and phase metrics; `plan` says where."""

    def prepare(self, prompts: list[StepPrompt], samples: list[Sample]) -> tuple[list[Tensor] | None, dict]:
        """Score samples in place; return reference log-probs (None without KL) and metrics."""

    def learn(self, samples: list[Sample], advantages: list[Tensor], ref: list[Tensor] | None) -> dict:
        """Update the policy; the next `generate` samples from the new weights."""

    def finish_step(self, step: int) -> tuple[dict, dict | None]:
        """After learning: the step's billing metrics and its timeline (None when not metered)."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def close(self) -> None: ...


def sampling_params(cfg: Config) -> SamplingParams:
    gen = cfg.generation
    return SamplingParams(
        max_new_tokens=gen.max_new_tokens, temperature=gen.temperature, top_p=gen.top_p, seed=cfg.seed
    )


def score(prompts: list[StepPrompt], samples: list[Sample], reward_fn: RewardFn) -> None:
    """Rewards in place, from the decoded response text."""
    by_uid = {p.uid: p.prompt for p in prompts}
    for s in samples:
        out = reward_fn(by_uid[s.uid], s.response)
        s.reward, s.reward_components = float(out.score), dict(out.components)


class InProcessExecutor:
    """Every phase in this process, on one engine that shares the learner's weights (no sync)."""

    def __init__(
        self,
        cfg: Config,
        policy: torch.nn.Module,
        reference: torch.nn.Module | None,
        tokenizer,
        reward_fn: RewardFn,
    ) -> None:
        self.cfg, self.policy, self.reference = cfg, policy, reference
        self.tokenizer, self.reward_fn = tokenizer, reward_fn
        self.params = sampling_params(cfg)
        self.version = 0
        self.engine = Engine(
            policy,
            eos_token_ids=[tokenizer.eos_token_id],
            pad_token_id=tokenizer.pad_token_id,
            weight_version=self.version,
            max_running=cfg.generation.max_running,
        )
        self.learner = Learner(
            policy,
            cfg.algorithm,
            cfg.optim,
            total_steps=cfg.trainer.steps,
            micro_batch_tokens=cfg.trainer.micro_batch_tokens,
            temperature=cfg.generation.temperature,
            pad_id=tokenizer.pad_token_id,
        )

    def generate(self, prompts: list[StepPrompt], plan: StepPlan, step: int) -> tuple[list[Sample], dict]:
        self.policy.eval()
        results, stats = rollout(
            self.engine,
            [(p.uid, p.prompt_ids) for p in prompts],
            self.cfg.algorithm.group_size,
            self.params,
            step,
            plan.prefix_length if self.cfg.scheduler.dedup_prefill else None,
        )
        texts = self.tokenizer.batch_decode([r.response_ids for r in results], skip_special_tokens=True)
        samples = [
            Sample(r.uid, r.sample, list(r.prompt_ids), list(r.response_ids), r.finish_reason, text)
            for r, text in zip(results, texts, strict=True)
        ]
        return canonical(samples), stats.metrics()

    def prepare(self, prompts: list[StepPrompt], samples: list[Sample]) -> tuple[list[Tensor] | None, dict]:
        start = time.perf_counter()
        score(prompts, samples, self.reward_fn)
        rewards = time.perf_counter() - start
        ref = None if self.reference is None else self.learner.logprobs(self.reference, samples)
        return ref, {"time/reward": rewards, "time/reference": time.perf_counter() - start - rewards}

    def learn(self, samples: list[Sample], advantages: list[Tensor], ref: list[Tensor] | None) -> dict:
        metrics = self.learner.learn(samples, advantages, ref)
        self.version += 1
        self.engine.weight_version = self.version  # same parameters as the learner: nothing to copy
        return metrics

    def finish_step(self, step: int) -> tuple[dict, dict | None]:
        return {}, None

    def state_dict(self) -> dict:
        return {"learner": self.learner.state_dict(), "version": self.version}

    def load_state_dict(self, state: dict) -> None:
        self.learner.load_state_dict(state["learner"])
        self.version = state["version"]
        self.engine.weight_version = self.version

    def close(self) -> None:
        pass
