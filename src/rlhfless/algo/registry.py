"""Name -> function tables for algorithms, advantage estimators, KL estimators and loss aggregations.

They are the one list of valid names: configs validate against them and select the algorithm math
by name; adding a variant is one decorated function, and a typo fails with the list of names that
do exist.
"""

from collections.abc import Callable
from typing import Any

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ALGORITHMS",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "Registry",
    "UnknownNameError",
    "get_advantage_estimator",
    "get_kl_estimator",
    "get_loss_aggregation",
    "register_advantage",
    "register_algorithm",
    "register_aggregation",
    "register_kl",
]


class UnknownNameError(KeyError):
    """A name that is not in a registry; the message lists the known names."""

    def __str__(self) -> str:  # KeyError would print the repr of the message, quotes included
        return str(self.args[0])


class Registry(dict[str, Callable[..., Any]]):
    """A dict of named functions whose lookups and registrations are checked."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def register(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator adding a function under `name`; registering a taken name is an error."""

        def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
            if name in self and self[name] is not fn:
                raise ValueError(f"{self.kind} {name!r} is already registered as {self[name].__qualname__}")
            self[name] = fn
            return fn

        return decorator

    def lookup(self, name: str) -> Callable[..., Any]:
        """The function registered under `name`, or `UnknownNameError` naming the known ones."""
        try:
            return self[name]
        except KeyError:
            known = ", ".join(sorted(self))
            raise UnknownNameError(f"unknown {self.kind} {name!r}; known: {known}") from None


# An RL algorithm (`algorithm.name`) maps to the advantage estimator it trains with; PPO's is GAE.
ALGORITHMS = Registry("algorithm")
ADVANTAGE_ESTIMATORS = Registry("advantage estimator")
KL_ESTIMATORS = Registry("KL estimator")
LOSS_AGGREGATIONS = Registry("loss aggregation")

register_algorithm = ALGORITHMS.register
register_advantage = ADVANTAGE_ESTIMATORS.register
register_kl = KL_ESTIMATORS.register
register_aggregation = LOSS_AGGREGATIONS.register
get_advantage_estimator = ADVANTAGE_ESTIMATORS.lookup
get_kl_estimator = KL_ESTIMATORS.lookup
get_loss_aggregation = LOSS_AGGREGATIONS.lookup
