"""RL algorithms of the engine: masked statistics, advantages, KL, and losses."""

from verl.algos.advantages import compute_gae, compute_grpo_advantages, place_score_on_last_token
from verl.algos.kl import AdaptiveKLController, FixedKLController, apply_kl_penalty, kl_penalty
from verl.algos.losses import (
    agg_loss,
    entropy_from_logits,
    kl_loss,
    logprobs_from_logits,
    policy_loss,
    value_loss,
)
from verl.algos.masked import masked_mean, masked_sum, masked_var, masked_whiten

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "agg_loss",
    "apply_kl_penalty",
    "compute_gae",
    "compute_grpo_advantages",
    "entropy_from_logits",
    "kl_loss",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "place_score_on_last_token",
    "policy_loss",
    "value_loss",
]
