"""PPO-family losses, loss aggregation, and memory-aware log-prob / entropy from logits.

Loss matrices are (batch, response_len); `response_mask` is 1 on policy-written tokens.
Metrics are returned as Python floats.
"""

import torch

from verl.algos.kl import kl_penalty
from verl.algos.masked import masked_mean, masked_sum

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", norm_const: float | None = None) -> torch.Tensor:
    """Reduce a (batch, response_len) loss to a scalar over policy tokens.

    token-mean: sum over all policy tokens / their count (DAPO).
    seq-mean-token-sum / seq-mean-token-mean: per-sequence token sum / mean, then the
        mean over sequences that have at least one policy token.
    seq-mean-token-sum-norm: per-sequence token sum / norm_const (default response_len),
        averaged over all sequences (Dr. GRPO's constant normaliser).
    """
    m = mask.bool()
    if mode == "token-mean":
        return masked_mean(loss_mat, m)
    seq_sum = masked_sum(loss_mat, m, dim=-1)  # (batch,)
    if mode == "seq-mean-token-sum-norm":
        const = float(norm_const if norm_const is not None else loss_mat.shape[-1])
        return seq_sum.mean() / const
    has_tokens = m.any(dim=-1)  # (batch,)
    if mode == "seq-mean-token-sum":
        return masked_mean(seq_sum, has_tokens)
    if mode == "seq-mean-token-mean":
        return masked_mean(masked_mean(loss_mat, m, dim=-1), has_tokens)
    raise ValueError(f"unknown loss aggregation {mode!r}; expected one of {AGG_MODES}")


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip_c: float | None = None,
    agg: str = "token-mean",
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with ratio clipped to [1 - clip_low, 1 + clip_high] (DAPO's
    decoupled ranges) and optional dual clip (Ye et al. 2020): for A < 0 the loss is
    capped at -A * dual_clip_c. `is_weights` (batch, response_len), constants: per-token
    importance weights of an off-policy batch (pi_old / pi_rollout, truncated), multiplying the
    surrogate. Returns (loss, {pg_clipfrac, ppo_kl, pg_clipfrac_lower}).
    """
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c must be > 1, got {dual_clip_c}")
    mask = response_mask.bool()
    log_ratio = logp - old_logp  # (batch, response_len)
    ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))  # clamp keeps exp finite on stale samples
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    clipfrac = masked_mean((loss_clipped > loss_unclipped).float(), mask)

    clipfrac_lower = torch.zeros(())
    if dual_clip_c is not None:
        cap = -advantages * dual_clip_c
        negative = advantages < 0
        clipfrac_lower = masked_mean(((loss > cap) & negative).float(), mask)
        loss = torch.where(negative, torch.minimum(loss, cap), loss)
    if is_weights is not None:
        loss = loss * is_weights.detach()

    metrics = {
        "pg_clipfrac": clipfrac.item(),
        "ppo_kl": masked_mean(-log_ratio.detach(), mask).item(),
        "pg_clipfrac_lower": clipfrac_lower.item(),
    }
    return agg_loss(loss, mask, agg), metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    clip_range: float | None = 0.5,
    agg: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """0.5 * max((v - R)^2, (v_clipped - R)^2), v_clipped = old + clamp(v - old, +-clip_range)."""
    mask = response_mask.bool()
    err_unclipped = (values - returns).square()  # (batch, response_len)
    if clip_range is None:
        return 0.5 * agg_loss(err_unclipped, mask, agg), {"vf_clipfrac": 0.0}
    v_clipped = old_values + (values - old_values).clamp(-clip_range, clip_range)
    err_clipped = (v_clipped - returns).square()
    loss = 0.5 * agg_loss(torch.maximum(err_unclipped, err_clipped), mask, agg)
    clipfrac = masked_mean((err_clipped > err_unclipped).float(), mask)
    return loss, {"vf_clipfrac": clipfrac.item()}


def kl_loss(
    logp: torch.Tensor, ref_logp: torch.Tensor, response_mask: torch.Tensor, kind: str = "k3", agg: str = "token-mean",
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """KL to the reference as a loss term (GRPO style), aggregated over policy tokens; `weights` (batch,
    response_len), constants, scale each token's KL (algorithm.decision_kl_weight) inside the same aggregation."""
    kl = kl_penalty(logp, ref_logp, kind)  # (batch, response_len)
    return agg_loss(kl if weights is None else kl * weights.detach(), response_mask, agg)


def _row_chunks(x: torch.Tensor, chunk_rows: int):
    flat = x.reshape(-1, x.shape[-1]) if x.ndim > 1 else x.reshape(-1)
    return flat.split(chunk_rows)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, chunk_rows: int = 1024) -> torch.Tensor:
    """log softmax(logits)[labels] per position: (b, t, v), (b, t) -> (b, t) float32.

    Computed as logit[label] - logsumexp(logits) in float32, `chunk_rows` positions at a
    time, so no full (b, t, v) float32 log-softmax is ever materialised.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} disagree")
    out = []
    for lg, lb in zip(_row_chunks(logits, chunk_rows), labels.reshape(-1).split(chunk_rows)):
        lg = lg.float()  # (rows, vocab)
        picked = lg.gather(-1, lb[:, None]).squeeze(-1)  # (rows,)
        out.append(picked - torch.logsumexp(lg, dim=-1))
    return torch.cat(out).reshape(labels.shape)


def entropy_from_logits(logits: torch.Tensor, chunk_rows: int = 1024) -> torch.Tensor:
    """Entropy of softmax(logits) per position, (b, t, v) -> (b, t) float32, chunked over positions.

    H = logsumexp(z) - sum softmax(z) * z, which avoids log(0) on underflowed probabilities.
    """
    out = []
    for lg in _row_chunks(logits, chunk_rows):
        lg = lg.float()  # (rows, vocab)
        out.append(torch.logsumexp(lg, dim=-1) - (torch.softmax(lg, dim=-1) * lg).sum(dim=-1))
    return torch.cat(out).reshape(logits.shape[:-1])


def token_nll(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """SFT: nll[:, t] = -log p(ids[:, t] | ids[:, :t]), (batch, seq); position 0 has no prediction and gets 0."""
    batch, seq, vocab = logits.shape
    # Predict every position from the one before; the last logit predicts nothing. Working
    # on the full contiguous logits avoids copying the largest tensor of the step.
    target = torch.cat([ids[:, 1:], ids[:, :1]], dim=1)  # (batch, seq); the wrapped last column is masked
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab).float(), target.reshape(-1), reduction="none")
    nll = nll.view(batch, seq)[:, :-1]  # (batch, seq-1): nll of ids[:, 1:]
    return torch.nn.functional.pad(nll, (1, 0))  # (batch, seq)


def masked_lm_loss(logits: torch.Tensor, ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """SFT: token-mean cross-entropy of the tokens with loss_mask == 1 (each predicted from the ones before)."""
    return masked_mean(token_nll(logits, ids), loss_mask)
