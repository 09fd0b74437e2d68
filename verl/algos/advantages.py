"""Advantage estimators: GAE over policy tokens only, and group-normalised (GRPO) scores.

All tensors are (batch, response_len) unless noted. `response_mask` is 1 on tokens the
policy wrote and 0 on environment <information> tokens and padding.
"""

from typing import Hashable, Sequence

import numpy as np
import torch

from verl.algos.masked import masked_whiten


def place_score_on_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Put each sequence's scalar score on its last policy token; zeros elsewhere.

    A row without policy tokens (an environment may mask a whole trajectory out of training,
    e.g. AdaTurn's `mask` baseline) gets no score: it contributes to no loss either way."""
    mask = response_mask.bool()
    if scores.shape != mask.shape[:1]:
        raise ValueError(f"scores has shape {tuple(scores.shape)}, expected ({mask.shape[0]},)")
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)  # (batch, response_len)
    last = torch.where(mask, positions, -1).max(dim=1).values  # (batch,)
    token_scores = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)  # (batch, response_len)
    rows = (last >= 0).nonzero().flatten()
    token_scores[rows, last[rows]] = scores[rows]
    return token_scores


@torch.no_grad()
def compute_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
    whiten: bool = True,
    whiten_groups: np.ndarray | Sequence[Hashable] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE whose steps are the policy tokens only; returns (advantages, returns).

    Environment tokens (mask 0 inside the response) are neither steps nor bootstrap
    points: a policy token's next value is the value at the next *policy* token, and
    the episode ends after the last one. Returns are the unwhitened advantages plus
    values; both outputs are 0 at masked positions. With gamma = lam = 1 the sum
    telescopes to A_t = sum of rewards from t on - V_t, which is exactly what the
    plain (unmasked) recursion gives too, so skipping environment tokens only matters
    when gamma or lam is below 1.

    `whiten_groups` (one key per row, e.g. each episode's cost weight alpha) whitens within each
    key's rows instead of over the batch, so rows with different reward scales are not compared.
    """
    mask = response_mask.bool()
    if token_rewards.shape != mask.shape or values.shape != mask.shape:
        raise ValueError(
            f"token_rewards {tuple(token_rewards.shape)} and values {tuple(values.shape)} "
            f"must match response_mask {tuple(mask.shape)}"
        )
    stray = (token_rewards != 0) & ~mask
    if stray.any():
        row, col = stray.nonzero()[0].tolist()
        raise ValueError(f"token_rewards is nonzero at a masked position (row {row}, token {col}); it would be lost")

    batch, length = mask.shape
    zeros = torch.zeros(batch, dtype=values.dtype, device=values.device)
    next_value, last_gae = zeros, zeros  # (batch,) state carried back over policy tokens
    advantages = torch.zeros_like(values)  # (batch, response_len)
    for t in reversed(range(length)):
        m = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        gae = delta + gamma * lam * last_gae
        # Masked tokens leave the carried state untouched, so they are skipped over.
        advantages[:, t] = torch.where(m, gae, zeros)
        next_value = torch.where(m, values[:, t], next_value)
        last_gae = torch.where(m, gae, last_gae)

    returns = torch.where(mask, advantages + values, torch.zeros_like(values))
    if whiten and whiten_groups is not None:
        advantages = whiten_within_groups(advantages, mask, whiten_groups)
    elif whiten:
        advantages = masked_whiten(advantages, mask)
    return advantages, returns


@torch.no_grad()
def whiten_within_groups(x: torch.Tensor, mask: torch.Tensor, groups: np.ndarray | Sequence[Hashable]) -> torch.Tensor:
    """masked_whiten applied to each group's rows on its own (zero mean, unit variance over its valid tokens)."""
    if len(groups) != x.shape[0]:
        raise ValueError(f"whiten groups has {len(groups)} entries, the batch has {x.shape[0]} rows")
    out = torch.zeros_like(x)
    rows: dict = {}
    for i, g in enumerate(groups):
        rows.setdefault(g, []).append(i)
    for idx in rows.values():
        sel = torch.as_tensor(idx, dtype=torch.long, device=x.device)
        out[sel] = masked_whiten(x[sel], mask[sel])
    return out


@torch.no_grad()
def compute_grpo_advantages(
    scores: torch.Tensor,
    group_ids: np.ndarray | Sequence[Hashable],
    response_mask: torch.Tensor,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative advantages (score - group mean) / (group std + eps), broadcast over policy tokens.

    Groups are keyed by `group_ids`, which must be unique per prompt (a uid, not a
    per-data-source row index, which collides across sources). The std is unbiased;
    a group of one sample gets advantage 0. A row with no policy token (masked out of
    training whole) is left out of its group's statistics as well. Returns (advantages,
    returns), equal here.
    """
    mask = response_mask.bool()
    n = scores.shape[0]
    if scores.ndim != 1 or len(group_ids) != n or mask.shape[0] != n:
        raise ValueError(
            f"scores must be (batch,) and match group_ids ({len(group_ids)}) and response_mask "
            f"({mask.shape[0]}); got scores {tuple(scores.shape)}"
        )
    ids: dict = {}
    group = torch.tensor([ids.setdefault(g, len(ids)) for g in group_ids], dtype=torch.long, device=scores.device)
    n_groups = len(ids)

    s = scores if scores.is_floating_point() else scores.to(torch.float32)
    new = dict(dtype=s.dtype, device=s.device)
    live = mask.any(dim=1).to(s.dtype)  # (batch,) 1 = the row has policy tokens
    count = torch.zeros(n_groups, **new).index_add_(0, group, live)  # (groups,)
    mean = torch.zeros(n_groups, **new).index_add_(0, group, s * live) / count.clamp(min=1)
    centred = (s - mean[group]) * live  # (batch,)
    sq = torch.zeros(n_groups, **new).index_add_(0, group, centred**2)
    std = (sq / (count - 1).clamp(min=1)).sqrt()  # (groups,)

    adv = centred / (std[group] + eps) if norm_by_std else centred
    adv = torch.where(count[group] > 1, adv, torch.zeros_like(adv))  # singletons carry no signal
    token_adv = torch.where(mask, adv[:, None], torch.zeros((), **new))  # (batch, response_len)
    return token_adv, token_adv
