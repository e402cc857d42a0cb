"""The `algorithm.` config section: which advantage estimator, policy loss and KL a run uses."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhfless.algo.registry import ALGORITHMS, KL_ESTIMATORS, LOSS_AGGREGATIONS
from rlhfless.checks import check


@dataclass
class AlgorithmConfig:
    """The `algorithm.` section: advantage estimator, policy loss and KL."""

    name: str = field(default="grpo", metadata={"help": f"RL algorithm: one of {', '.join(ALGORITHMS)}"})
    group_size: int = field(default=4, metadata={"help": "samples per prompt (G)"})
    norm_adv_by_std: bool = field(
        default=True, metadata={"help": "GRPO: divide group-centred rewards by the group's std"}
    )
    clip_low: float = field(default=0.2, metadata={"help": "PPO clip: ratio lower bound is 1 - clip_low"})
    clip_high: float = field(default=0.2, metadata={"help": "PPO clip: ratio upper bound is 1 + clip_high"})
    dual_clip: float | None = field(
        default=None, metadata={"help": "dual clip constant (> 1) for negative advantages; null disables"}
    )
    kl_coef: float = field(
        default=0.0,
        metadata={
            "help": "KL-to-reference coefficient: of the KL loss, or the initial beta with kl_in_reward; "
            "0 disables the reference model"
        },
    )
    kl_estimator: str = field(
        default="k3", metadata={"help": f"KL estimator: one of {', '.join(KL_ESTIMATORS)}"}
    )
    loss_agg: str = field(
        default="token-mean",
        metadata={
            "help": f"loss aggregation: one of {', '.join(LOSS_AGGREGATIONS)}; seq-mean-token-sum-norm "
            "divides by generation.max_new_tokens, a constant whatever the micro-batching"
        },
    )
    epochs: int = field(default=1, metadata={"help": "passes over each step's samples (policy and critic)"})
    mini_batches: int = field(default=1, metadata={"help": "optimizer steps per epoch (policy and critic)"})
    gamma: float = field(
        default=1.0, metadata={"help": "ppo, reinforce_pp: discount per response token, in [0, 1]"}
    )
    lam: float = field(default=0.95, metadata={"help": "ppo: GAE lambda, in [0, 1]"})
    critic_lr: float = field(
        default=1e-4,
        metadata={
            "help": "ppo: the critic's AdamW learning rate (its own optimizer); its value head starts "
            "at 0, and at 1e-5 it needs far more steps than a CPU run makes to reach the returns"
        },
    )
    value_clip: float | None = field(
        default=0.2,
        metadata={
            "help": "ppo: values move at most this far from the rollout's values in the loss; null disables"
        },
    )
    critic_warmup: int = field(
        default=0, metadata={"help": "ppo: first N steps train only the critic (the policy stays put)"}
    )
    normalize_reward: bool = field(
        default=False,
        metadata={
            "help": "ppo, reinforce_pp: whiten the step's sequence rewards (zero mean, unit std) before "
            "the KL penalty and the returns, so the critic's targets keep one scale while the reward "
            "climbs; a rare success in a step becomes a large target"
        },
    )
    kl_in_reward: bool = field(
        default=False,
        metadata={
            "help": "ppo, reinforce_pp: subtract beta * KL(policy || reference) from every response "
            "token's reward (beta starts at kl_coef) instead of adding a KL loss"
        },
    )
    kl_ctrl: str = field(
        default="fixed",
        metadata={"help": "KL-in-reward coefficient: 'fixed', or 'adaptive' (steered towards target_kl)"},
    )
    target_kl: float = field(
        default=0.1, metadata={"help": "adaptive kl_ctrl: the per-sequence KL beta is steered towards"}
    )
    kl_horizon: int = field(
        default=10000, metadata={"help": "adaptive kl_ctrl: samples over which beta moves by at most 20%"}
    )

    def __post_init__(self) -> None:
        check(self.name in ALGORITHMS, "name", self.name, f"one of {', '.join(ALGORITHMS)}")
        check(self.group_size >= 1, "group_size", self.group_size, "an integer >= 1")
        check(
            self.group_size >= 2 or not getattr(ALGORITHMS[self.name], "group_relative", False),
            "group_size",
            self.group_size,
            f"an integer >= 2 for {self.name} (a group of one sample has no baseline: every advantage "
            "is 0); ppo and reinforce_pp train on single samples",
        )
        check(0 <= self.clip_low < 1, "clip_low", self.clip_low, "a number in [0, 1)")
        check(self.clip_high >= 0, "clip_high", self.clip_high, "a number >= 0")
        check(self.dual_clip is None or self.dual_clip > 1, "dual_clip", self.dual_clip, "null or > 1")
        check(self.kl_coef >= 0, "kl_coef", self.kl_coef, "a number >= 0")
        check(
            self.kl_estimator in KL_ESTIMATORS,
            "kl_estimator",
            self.kl_estimator,
            f"one of {', '.join(KL_ESTIMATORS)}",
        )
        check(
            self.loss_agg in LOSS_AGGREGATIONS,
            "loss_agg",
            self.loss_agg,
            f"one of {', '.join(LOSS_AGGREGATIONS)}",
        )
        check(self.epochs >= 1, "epochs", self.epochs, "an integer >= 1")
        check(self.mini_batches >= 1, "mini_batches", self.mini_batches, "an integer >= 1")
        check(0 <= self.gamma <= 1, "gamma", self.gamma, "a number in [0, 1]")
        check(0 <= self.lam <= 1, "lam", self.lam, "a number in [0, 1]")
        check(self.critic_lr > 0, "critic_lr", self.critic_lr, "a number > 0")
        check(self.value_clip is None or self.value_clip > 0, "value_clip", self.value_clip, "null or > 0")
        check(self.critic_warmup >= 0, "critic_warmup", self.critic_warmup, "an integer >= 0")
        token_level = ("ppo", "reinforce_pp")
        check(
            not self.normalize_reward or self.name in token_level,
            "normalize_reward",
            self.normalize_reward,
            f"false unless name is one of {token_level} (per-token rewards)",
        )
        check(
            not self.kl_in_reward or self.name in token_level,
            "kl_in_reward",
            self.kl_in_reward,
            f"false unless name is one of {token_level} (per-token rewards)",
        )
        check(
            not self.kl_in_reward or self.kl_coef > 0,
            "kl_in_reward",
            self.kl_in_reward,
            "false unless kl_coef > 0 (kl_coef is the initial beta)",
        )
        check(self.kl_ctrl in ("fixed", "adaptive"), "kl_ctrl", self.kl_ctrl, "'fixed' or 'adaptive'")
        check(
            self.kl_ctrl == "fixed" or self.kl_in_reward,
            "kl_ctrl",
            self.kl_ctrl,
            "'fixed' unless kl_in_reward=true",
        )
        check(self.target_kl > 0, "target_kl", self.target_kl, "a number > 0")
        check(self.kl_horizon >= 1, "kl_horizon", self.kl_horizon, "an integer >= 1")
