"""KL estimators between the policy and the reference model, and KL coefficient controllers.

Estimators follow http://joschu.net/blog/kl-approx.html: with log-ratio
d = logp - ref_logp on samples from the policy, k1 = d is unbiased, k2 = d^2 / 2 is
low-variance but biased, k3 = exp(-d) + d - 1 is unbiased and always >= 0.
"""

from dataclasses import dataclass

import torch

from verl.algos.masked import masked_mean

KL_KINDS = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-token KL estimate of the policy from the reference, same shape as logp."""
    diff = logp - ref_logp
    if kind in ("k1", "kl"):
        return diff
    if kind == "abs":
        return diff.abs()
    if kind in ("k2", "mse"):
        return 0.5 * diff.square()
    if kind in ("k3", "low_var_kl"):
        # Clamping the log-ratio keeps exp finite; any |r| > 12 is clamped to 10 below anyway.
        r = (ref_logp - logp).clamp(-20, 20)
        return (r.exp() - r - 1).clamp(-10, 10)
    raise ValueError(f"unknown KL kind {kind!r}; expected one of {KL_KINDS}")


@dataclass
class FixedKLController:
    """A constant KL coefficient."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController:
    """Proportional controller of Ziegler et al. (2019) steering the KL towards `target`."""

    def __init__(self, init_coef: float, target: float, horizon: int):
        if target <= 0 or horizon <= 0:
            raise ValueError(f"target ({target}) and horizon ({horizon}) must be positive")
        self.value = init_coef
        self.target = target
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Raise the coefficient when the KL is above target, lower it when below."""
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    kind: str = "k1",
) -> tuple[torch.Tensor, float]:
    """Rewards = scores - kl_coef * KL on policy tokens; also the batch's mean per-sequence KL."""
    mask = response_mask.bool()
    kl = torch.where(mask, kl_penalty(logp, ref_logp, kind), torch.zeros((), dtype=logp.dtype, device=logp.device))
    rewards = token_level_scores - kl_coef * kl  # (batch, response_len)
    seq_kl = masked_mean(kl, mask, dim=-1)  # (batch,)
    has_tokens = mask.any(dim=-1)
    mean_kl = masked_mean(seq_kl, has_tokens).item()
    return rewards, mean_kl
