"""The executor interface the step controller drives, and the in-process executor.

A step is generate -> prepare -> learn. Executors decide where each phase runs (this process, or
Ray functions); they never decide what is trained on: samples come back in canonical order and
are drawn from placement-independent random streams.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor

from rlhfless.config import Config
from rlhfless.engine import Engine, SamplingParams, rollout
from rlhfless.planner import ClusterSpec, StepPlan
from rlhfless.rewards import RewardFn
from rlhfless.runtime.checkpoint import load_learner_state
from rlhfless.runtime.critic import Critic, ValueModel
from rlhfless.runtime.learner import Learner, prime
from rlhfless.runtime.prefixes import prefill_metrics, prefix_tree
from rlhfless.runtime.samples import Sample, StepPrompt, canonical, decoded


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

    def warm_up(self) -> None:
        """Before the first step: start what every step uses and no plan pays for (the functions
        on the learner's own resources), so that the first step does not wait for them."""

    def warm_functions(self) -> int:
        """Warm decode functions (with resources of their own) the next plan can reuse."""

    def host_starting_s(self) -> float | None:
        """How long the decode function on the learner's resources has been starting (0: not
        started at all); None when it is started, or runs in this process."""

    def cluster(self) -> ClusterSpec | None:
        """The cluster the next plan is made for, as it is now (None: the planner's own)."""

    def save_state(self, path: Path) -> None:
        """Write the learner's state for a checkpoint (optimizers, schedule, PPO's critic, the
        weight version) to `path`, from the process that holds it: never through the driver."""

    def load_state(self, path: Path) -> None:
        """Restore a checkpoint's learner state from `path` (checked by `checkpoint.load_checkpoint`),
        read by the process that holds the learner: never through the driver."""

    def close(self) -> None: ...


def sampling_params(cfg: Config) -> SamplingParams:
    gen = cfg.generation
    return SamplingParams(
        max_new_tokens=gen.max_new_tokens, temperature=gen.temperature, top_p=gen.top_p, seed=cfg.seed
    )


def cuda_graphs(cfg: Config, device: str | torch.device) -> bool:
    """Whether an engine on `device` replays its decode steps as CUDA graphs (`generation.cuda_graphs`,
    which a CPU ignores)."""
    return cfg.generation.cuda_graphs and torch.device(device).type == "cuda"


def build_engine(cfg: Config, policy: torch.nn.Module, tokenizer, decodes: bool | None = None) -> Engine:
    """The learner's engine on the policy's own parameters, in their dtype (never `compute_dtype`:
    see `precision`): the prefill function (and, in-process, the only decode actor, which alone
    reorders its weights for `generation.packed_weights`: under Ray it only prefills). `decodes`:
    whether it decodes (default: in-process)."""
    if decodes is None:
        decodes = cfg.runtime.executor == "inprocess"
    return Engine(
        policy,
        eos_token_ids=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
        weight_version=0,
        max_running=cfg.generation.max_running,
        cuda_graphs=cuda_graphs(cfg, next(policy.parameters()).device),
        packed_weights=cfg.generation.packed_weights and decodes,
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
        compute_dtype=cfg.model.compute_dtype,
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
        compute_dtype=cfg.model.compute_dtype,
    )


def score(prompts: list[StepPrompt], samples: list[Sample], reward_fn: RewardFn) -> None:
    """Rewards in place, from the decoded response text; a reward model scores them in batches."""
    by_uid = {p.uid: p.prompt for p in prompts}
    outputs = reward_fn.score_batch([by_uid[s.uid] for s in samples], [s.response for s in samples])
    for s, out in zip(samples, outputs, strict=True):
        s.reward, s.reward_components = float(out.score), dict(out.components)


class LearnerReplica:
    """One replica of the learner: the policy with its optimizer, and PPO's critic. The in-process
    learner holds one; each data-parallel rank is one (`dp_learner.LearnerRank`)."""

    def __init__(self, cfg: Config, policy: torch.nn.Module, pad_id: int) -> None:
        self.policy = policy
        self.learner = build_learner(cfg, policy, pad_id)
        self.critic = build_critic(cfg, policy, pad_id)  # from the same initial weights

    def logprobs(self, samples: list[Sample]) -> list[Tensor]:
        return self.learner.logprobs(self.policy, samples)

    def critic_update(self, samples: list[Sample], rewards: list[Tensor]) -> tuple[list[Tensor], dict]:
        return self.critic.update(samples, rewards)

    def learn(
        self,
        samples: list[Sample],
        advantages: list[Tensor],
        ref: list[Tensor] | None,
        old: list[Tensor] | None,
        ahead: frozenset[tuple[str, int]] = frozenset(),
    ) -> dict:
        return self.learner.learn(samples, advantages, ref, old, ahead)

    def learn_ahead(self, samples: list[Sample], advantages: list[Tensor], ref: list[Tensor] | None) -> int:
        return self.learner.learn_ahead(samples, advantages, ref)

    def state_dict(self) -> dict:
        state = {"learner": self.learner.state_dict()}
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.learner.load_state_dict(state["learner"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])

    def save_state(self, path: str, extra: dict) -> None:
        """`state_dict()` and `extra` written to `path` by this replica's process (`torch.save`)."""
        torch.save({**self.state_dict(), **extra}, path)

    def load_state(self, path: str) -> int:
        """What `save_state` wrote to `path`, restored; its weight version. The file is mapped, not
        read: the optimizer takes the mapped tensors as its states (copy-on-write), no copy."""
        state = load_learner_state(Path(path), mmap=True)
        self.load_state_dict(state)
        return state["version"]

    def prime(self) -> None:
        """The optimizers' states allocated now (`learner.prime`), before the first update: for
        rank 0, the replica that steps, while the run starts (the in-process learner has nothing
        running beside it to hide this behind)."""
        prime(self.learner.optimizer)
        if self.critic is not None:
            prime(self.critic.optimizer)

    def phase_state(self) -> dict:
        """What a rank joining for one learning phase needs besides the policy's weights: where
        the schedule is, and PPO's critic weights and update count. Not the optimizers' states:
        only rank 0 steps (`DataParallel.step`)."""
        state = {"scheduler": self.learner.scheduler.state_dict()}
        if self.critic is not None:
            state["critic"] = {"model": self.critic.model.state_dict(), "updates": self.critic.updates}
        return state

    def load_phase_state(self, state: dict) -> None:
        self.learner.scheduler.load_state_dict(state["scheduler"])
        if self.critic is not None:
            self.critic.model.load_state_dict(state["critic"]["model"])
            self.critic.updates = state["critic"]["updates"]


class LearnerSide:
    """The learner's side of every executor: the policy, an engine on its very parameters (the
    prefill function, and in-process the only decode actor), the weight version, and the verbs
    the step loop calls. Subclasses say where a replica's method runs (`_run`: in this process,
    or on every data-parallel rank) and how a checkpoint's state reaches it (`_restore`)."""

    def __init__(self, cfg: Config, policy: torch.nn.Module, tokenizer) -> None:
        self.cfg, self.policy = cfg, policy
        self.params = sampling_params(cfg)
        self.version = 0
        self.engine = build_engine(cfg, policy, tokenizer)

    def _run(self, method: str, *args):
        """`LearnerReplica.method(*args)` wherever the replicas are; the first replica's result."""
        raise NotImplementedError

    def _save(self, path: str, extra: dict) -> None:
        """The first replica's `save_state`."""
        self._run("save_state", path, extra)

    def _load(self, path: str) -> int:
        """The first replica's `load_state` (the policy's weights are already in `self.policy`)."""
        return self._run("load_state", path)

    def _synced(self) -> dict:
        """After an update: `self.policy` made the updated one; metrics of doing so."""
        return {}

    def _phase(self) -> dict:
        """Metrics of the learning phase (its width, its start)."""
        return {}

    def _ahead(self, samples: list[Sample], advantages: list[Tensor]) -> frozenset[tuple[str, int]]:
        """The samples whose gradients a replica learned ahead, with the very advantages given now
        (`LearnerReplica.learn_ahead`); none in this process."""
        return frozenset()

    def policy_logprobs(self, samples: list[Sample]) -> list[Tensor]:
        return self._run("logprobs", samples)

    def critic_update(self, samples: list[Sample], rewards: list[Tensor]) -> tuple[list[Tensor], dict]:
        if self.cfg.algorithm.name != "ppo":
            raise RuntimeError("critic_update: this run has no critic (algorithm.name is not ppo)")
        advantages, metrics = self._run("critic_update", samples, rewards)
        return advantages, metrics | self._phase()

    def learn(
        self,
        samples: list[Sample],
        advantages: list[Tensor],
        ref: list[Tensor] | None,
        old: list[Tensor] | None = None,
    ) -> dict:
        ahead = self._ahead(samples, advantages)
        metrics = self._run("learn", samples, advantages, ref, old, ahead) | self._phase() | self._synced()
        self.version += 1
        self.engine.weight_version = self.version
        return metrics

    def save_state(self, path: Path) -> None:
        self._save(str(path), {"version": self.version})

    def load_state(self, path: Path) -> None:
        self.version = self._load(str(path))
        self.engine.weight_version = self.version


class LocalLearner(LearnerSide):
    """The learner in this process: one replica on the policy itself, so the engine needs no copy."""

    def __init__(
        self,
        cfg: Config,
        policy: torch.nn.Module,
        reference: torch.nn.Module | None,
        tokenizer,
        reward_fn: RewardFn,
    ) -> None:
        super().__init__(cfg, policy, tokenizer)
        self.reference, self.tokenizer, self.reward_fn = reference, tokenizer, reward_fn
        self.replica = LearnerReplica(cfg, policy, tokenizer.pad_token_id)
        self.learner, self.critic = self.replica.learner, self.replica.critic

    def _run(self, method: str, *args):
        return getattr(self.replica, method)(*args)


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
            prefix_tree(plan, prompts),
        )
        metrics = stats.metrics()
        return canonical(decoded(results, self.tokenizer)), {
            **metrics,
            **prefill_metrics(plan, metrics["prefill/tokens_computed"]),
        }

    def prepare(self, prompts: list[StepPrompt], samples: list[Sample]) -> tuple[list[Tensor] | None, dict]:
        start = time.perf_counter()
        score(prompts, samples, self.reward_fn)
        rewards = time.perf_counter() - start
        ref = None if self.reference is None else self.learner.logprobs(self.reference, samples)
        return ref, {"time/reward": rewards, "time/reference": time.perf_counter() - start - rewards}

    def finish_step(self, step: int) -> tuple[dict, dict | None]:
        return {}, None

    def warm_up(self) -> None:
        pass  # nothing to start: every phase runs in this process

    def warm_functions(self) -> int:
        return 0

    def host_starting_s(self) -> float | None:
        return None

    def cluster(self) -> ClusterSpec | None:
        return None

    def close(self) -> None:
        pass
