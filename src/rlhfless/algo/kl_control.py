"""KL coefficient controllers for the KL-in-reward penalty `r_t - beta * kl_t` (Ziegler et al.,
2019): a fixed `beta`, or one steered towards a target KL. Pure Python, no tensors."""

__all__ = ["AdaptiveKLController", "FixedKLController"]


class FixedKLController:
    """A constant coefficient: `value` never changes."""

    def __init__(self, kl_coef: float) -> None:
        if kl_coef < 0:
            raise ValueError(f"kl_coef: got {kl_coef}, expected >= 0")
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """Does nothing; present so that both controllers can be used alike."""


class AdaptiveKLController:
    """Proportional controller on the KL error, multiplicative in beta:
    `e = clip(current_kl / target_kl - 1, -0.2, 0.2)`, `beta <- beta * (1 + e * n_steps / horizon)`.

    Above the target KL the coefficient grows, below it shrinks, by at most 20% per `horizon`
    samples; `n_steps` is how many samples (or steps, in the same unit as `horizon`) the
    measured KL covers.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if init_kl_coef <= 0:
            raise ValueError(f"init_kl_coef: got {init_kl_coef}, expected > 0")
        if target_kl <= 0:
            raise ValueError(f"target_kl: got {target_kl}, expected > 0")
        if horizon <= 0:
            raise ValueError(f"horizon: got {horizon}, expected > 0")
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move `value` towards the coefficient that would give `target_kl`."""
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
