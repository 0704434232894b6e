"""KL estimators and coefficient controllers for the reference-model penalty."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["KL_ESTIMATORS", "AdaptiveKLController", "FixedKLController", "kl_estimate"]

KL_ESTIMATORS = ("k1", "k2", "k3")
_K3_CLAMP = 10.0  # verl's "low_var_kl" clamps k3 to [-10, 10] against outliers


def kl_estimate(logp_BR: torch.Tensor, ref_logp_BR: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from tokens sampled from π_θ.

    With log r = log π_ref(y_t) - log π_θ(y_t) (Schulman 2020, "Approximating KL Divergence"):
    k1 = -log r;  k2 = ½ (log r)²;  k3 = (r - 1) - log r  (unbiased, non-negative, low variance;
    clamped to ±10 as verl does).

    k3 is computed as expm1(log r) - log r: with exp(log r) - 1 the subtraction cancels
    when π ≈ π_ref and float32 rounding made it negative (down to -6e-8); expm1 is exact
    to an ulp there, and the result is clamped at 0 so k3 ≥ 0 always holds.
    """
    log_r_BR = ref_logp_BR - logp_BR
    if estimator == "k1":
        return -log_r_BR
    if estimator == "k2":
        return 0.5 * log_r_BR**2
    if estimator == "k3":
        log_r_BR = torch.clamp(log_r_BR, -20.0, 20.0)
        return torch.clamp(torch.expm1(log_r_BR) - log_r_BR, 0.0, _K3_CLAMP)
    raise ValueError(f"unknown KL estimator {estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")


class FixedKLController:
    """A constant β."""

    def __init__(self, coef: float) -> None:
        self.value = coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """Does nothing (β is fixed)."""

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Adaptive β (Ziegler et al. 2019, "Fine-Tuning LMs from Human Preferences", §2.2).

    e = clip(KL/target - 1, -0.2, 0.2);  β ← β (1 + e · n_steps / horizon).
    """

    def __init__(self, coef: float, target: float, horizon: int) -> None:
        self.value = coef
        self.target = target
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Moves β toward the target after a batch of ``n_steps`` samples."""
        err = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + err * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])
