"""The algorithm math of RLHFless as small pure torch functions: advantage estimators, KL
estimators, loss aggregations, the PPO policy and value losses, and KL coefficient controllers.

Tensors in, tensors out; token-level tensors are `[batch, seq]` with `mask` 1 on response tokens.
Algorithms, estimators and aggregations are also reachable by name through the registries, which
are the one list of the names a config may use.
"""

from rlhfless.algo.advantages import gae, grpo_advantages, reinforce_pp_advantages, rloo_advantages
from rlhfless.algo.aggregation import aggregate_loss
from rlhfless.algo.kl import kl_penalty
from rlhfless.algo.kl_control import AdaptiveKLController, FixedKLController
from rlhfless.algo.losses import policy_loss, value_loss
from rlhfless.algo.masked import explained_variance, masked_mean, masked_var, whiten
from rlhfless.algo.registry import (
    ADVANTAGE_ESTIMATORS,
    ALGORITHMS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    UnknownNameError,
    get_advantage_estimator,
    get_kl_estimator,
    get_loss_aggregation,
    register_advantage,
    register_aggregation,
    register_algorithm,
    register_kl,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ALGORITHMS",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "AdaptiveKLController",
    "FixedKLController",
    "UnknownNameError",
    "aggregate_loss",
    "explained_variance",
    "gae",
    "get_advantage_estimator",
    "get_kl_estimator",
    "get_loss_aggregation",
    "grpo_advantages",
    "kl_penalty",
    "masked_mean",
    "masked_var",
    "policy_loss",
    "register_advantage",
    "register_aggregation",
    "register_algorithm",
    "register_kl",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "value_loss",
    "whiten",
]
