"""DAPO's batch-level pieces (Yu et al. 2025): dynamic sampling and the soft overlong penalty.

The other DAPO parts live where they belong: group-normalised advantages in
advantages.compute_grpo_advantages, the decoupled clip in losses.policy_loss
(clip_low / clip_high), token-level normalisation in losses.agg_loss("token-mean").
"""
from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np


def _groups(group_ids: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    """Row indices per group, groups in order of first appearance."""
    out: dict[Hashable, list[int]] = {}
    for i, g in enumerate(group_ids):
        out.setdefault(g, []).append(i)
    return out


def informative_groups(scores: Sequence[float], group_ids: Sequence[Hashable]) -> dict[Hashable, bool]:
    """Per group (in order of first appearance): True when its rewards are not all equal.

    An all-equal group has zero group-normalised advantage everywhere, so it adds no
    policy gradient, only tokens to the denominator; DAPO drops it.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 1 or len(scores) != len(group_ids):
        raise ValueError(f"scores must be (batch,) and match group_ids ({len(group_ids)}); got {scores.shape}")
    return {g: bool(scores[idx].max() != scores[idx].min()) for g, idx in _groups(group_ids).items()}


def select_groups(scores: Sequence[float], group_ids: Sequence[Hashable], n_groups: int,
                  multiple: int = 1) -> tuple[list[int], dict[str, int]]:
    """Row indices of the first `n_groups` informative groups, in row order.

    When fewer exist (the generation cap was hit), all informative groups are taken and
    all-equal groups (zero advantage) are added, in order, only until the row count is a
    positive multiple of `multiple` (the data-parallel world size). Returns (rows, counts).
    """
    if n_groups < 1 or multiple < 1:
        raise ValueError(f"n_groups and multiple must be >= 1, got {n_groups} and {multiple}")
    rows_of = _groups(group_ids)
    spread = informative_groups(scores, group_ids)
    chosen = [g for g, ok in spread.items() if ok][:n_groups]
    fillers = (g for g, ok in spread.items() if not ok)
    n_rows = sum(len(rows_of[g]) for g in chosen)
    n_filled = 0
    while n_rows == 0 or n_rows % multiple:
        g = next(fillers, None)
        if g is None:
            raise ValueError(f"dynamic sampling: {len(group_ids)} rows cannot give a positive multiple of "
                             f"{multiple} rows in whole groups")
        chosen.append(g)
        n_rows += len(rows_of[g])
        n_filled += 1
    rows = sorted(i for g in chosen for i in rows_of[g])
    counts = {"kept": sum(spread.values()), "dropped": len(spread) - sum(spread.values()),
              "trained": len(chosen), "filled": n_filled}
    return rows, counts


def overlong_penalty(lengths: Sequence[int], max_length: int, buffer: int, factor: float = 1.0) -> np.ndarray:
    """DAPO's soft overlong punishment, (batch,) values in [-factor, 0].

    0 up to max_length - buffer tokens, then falling linearly to -factor at max_length
    (and staying there beyond it).
    """
    if not 0 < buffer <= max_length:
        raise ValueError(f"overlong buffer must be in (0, max_length={max_length}], got {buffer}")
    lengths = np.asarray(lengths, dtype=np.float64)  # (batch,)
    over = np.clip(lengths - (max_length - buffer), 0.0, buffer) / buffer
    return -factor * over
