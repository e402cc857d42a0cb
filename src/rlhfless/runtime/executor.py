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
from rlhfless.planner import ClusterSpec, StepPlan
from rlhfless.rewards import RewardFn
from rlhfless.runtime.critic import Critic, ValueModel
from rlhfless.runtime.learner import Learner
from rlhfless.runtime.samples import Sample, StepPrompt, canonical


class Executor(Protocol):
    policy: torch.nn.Module

    def generate(self, prompts: list[StepPrompt], plan: StepPlan, step: int) -> tuple[list[Sample], dict]:
        """All G samples of every prompt, canonical order, and phase metrics; `plan` says where."""

    def prepare(self, prompts: list[StepPrompt], samples: list[Sample]) -> tuple[list[Tensor] | None, dict]:
        """Score samples in place; return reference log-probs (None without KL) and metrics."""

    def policy_logprobs(self, samples: list[Sample]) -> list[Tensor]:
        """The current policy's response log-probs, no gradients: the old log-probs that the KL in
        the reward (`algorithm.kl_in_reward`) is measured with; `learn` then gets them as `old`."""

    def critic_update(self, samples: list[Sample], rewards: list[Tensor]) -> tuple[list[Tensor], dict]:
        """PPO (the executor owns the critic): per-token GAE advantages (not whitened) from the
        critic's values before its update, after fitting it to this step's returns; `rewards`
        are per-sample token rewards. Metrics: `loss/value`, `value/mean`, `value/explained_variance`."""

    def learn(
        self,
        samples: list[Sample],
        advantages: list[Tensor],
        ref: list[Tensor] | None,
        old: list[Tensor] | None = None,
    ) -> dict:
        """Update the policy; the next `generate` samples from the new weights. `old`: the
        policy's log-probs from `policy_logprobs` when already computed this step."""

    def finish_step(self, step: int) -> tuple[dict, dict | None]:
        """After learning: the step's billing metrics and its timeline (None when not metered)."""

    def warm_functions(self) -> int:
        """Warm decode functions (with resources of their own) the next plan can reuse."""

    def cluster(self) -> ClusterSpec | None:
        """The cluster the next plan is made for, as it is now (None: the planner's own)."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def close(self) -> None: ...


def sampling_params(cfg: Config) -> SamplingParams:
    gen = cfg.generation
    return SamplingParams(
        max_new_tokens=gen.max_new_tokens, temperature=gen.temperature, top_p=gen.top_p, seed=cfg.seed
    )


def build_engine(cfg: Config, policy: torch.nn.Module, tokenizer) -> Engine:
    """The learner's engine on the policy's own parameters: the prefill function (and, in-process,
    the only decode actor)."""
    return Engine(
        policy,
        eos_token_ids=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
        weight_version=0,
        max_running=cfg.generation.max_running,
    )


def build_learner(cfg: Config, policy: torch.nn.Module, pad_id: int) -> Learner:
    """The policy's optimizer and update, as the run's config sets them."""
    return Learner(
        policy,
        cfg.algorithm,
        cfg.optim,
        total_steps=cfg.trainer.steps,
        micro_batch_tokens=cfg.trainer.micro_batch_tokens,
        temperature=cfg.generation.temperature,
        pad_id=pad_id,
        seed=cfg.seed,
        norm_len=cfg.generation.max_new_tokens,
    )


def build_critic(cfg: Config, policy: torch.nn.Module, pad_id: int) -> Critic | None:
    """PPO's critic, started from the policy's weights; None for the critic-free algorithms."""
    if cfg.algorithm.name != "ppo":
        return None
    model = ValueModel.from_policy(policy)
    return Critic(
        model,
        cfg.algorithm,
        cfg.optim,
        cfg.trainer.micro_batch_tokens,
        pad_id,
        seed=cfg.seed,
        norm_len=cfg.generation.max_new_tokens,
    )


def score(prompts: list[StepPrompt], samples: list[Sample], reward_fn: RewardFn) -> None:
    """Rewards in place, from the decoded response text; a reward model scores them in batches."""
    by_uid = {p.uid: p.prompt for p in prompts}
    outputs = reward_fn.score_batch([by_uid[s.uid] for s in samples], [s.response for s in samples])
    for s, out in zip(samples, outputs, strict=True):
        s.reward, s.reward_components = float(out.score), dict(out.components)


class LocalLearner:
    """The learner's side, common to every executor: the policy with its optimizer (and PPO's
    critic), and an engine on the very same parameters, which serves as the prefill actor."""

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
        self.engine = build_engine(cfg, policy, tokenizer)
        self.learner = build_learner(cfg, policy, tokenizer.pad_token_id)
        self.critic = build_critic(cfg, policy, tokenizer.pad_token_id)

    def policy_logprobs(self, samples: list[Sample]) -> list[Tensor]:
        return self.learner.logprobs(self.policy, samples)

    def critic_update(self, samples: list[Sample], rewards: list[Tensor]) -> tuple[list[Tensor], dict]:
        if self.critic is None:
            raise RuntimeError("critic_update: this run has no critic (algorithm.name is not ppo)")
        return self.critic.update(samples, rewards)

    def learn(
        self,
        samples: list[Sample],
        advantages: list[Tensor],
        ref: list[Tensor] | None,
        old: list[Tensor] | None = None,
    ) -> dict:
        metrics = self.learner.learn(samples, advantages, ref, old)
        self.version += 1
        self.engine.weight_version = self.version  # same parameters as the learner: nothing to copy
        return metrics

    def state_dict(self) -> dict:
        state = {"learner": self.learner.state_dict(), "version": self.version}
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.learner.load_state_dict(state["learner"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
        self.version = state["version"]
        self.engine.weight_version = self.version


class InProcessExecutor(LocalLearner):
    """Every phase in this process, on the learner's own engine (no weight sync, one actor)."""

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

    def finish_step(self, step: int) -> tuple[dict, dict | None]:
        return {}, None

    def warm_functions(self) -> int:
        return 0

    def cluster(self) -> ClusterSpec | None:
        return None

    def close(self) -> None:
        pass
