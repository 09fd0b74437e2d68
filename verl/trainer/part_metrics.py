"""Per-part metrics of a trained batch: where in the response the advantage, the critic's value and the policy's
uncertainty sit, for an env that labels its response tokens (its `token_parts(response_ids)`, names from its
`part_names`; 0 = no part). Whether the reward reaches the tokens that decide it is read here.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def part_tensor(parts: Sequence[Sequence[int]], shape: tuple[int, int]) -> torch.Tensor:
    """The rows' part ids padded (0) to `shape` (batch, response_len), as the responses are."""
    out = torch.zeros(shape, dtype=torch.long)
    for i, row in enumerate(parts):
        if len(row) > shape[1]:
            raise ValueError(f"token_part row {i} has {len(row)} labels for a response of {shape[1]} tokens")
        out[i, :len(row)] = torch.as_tensor(list(row), dtype=torch.long)
    return out


def part_id(names: Sequence[str], name: str) -> int:
    """The id `part_tensor` holds for the part `name` of the env's part_names (0: a token of none of them)."""
    return list(names).index(name) + 1


def part_metrics(parts: torch.Tensor, names: Sequence[str], mask: torch.Tensor, advantages: torch.Tensor,
                 old_log_probs: torch.Tensor, values: torch.Tensor | None = None,
                 scores: torch.Tensor | None = None) -> dict[str, float]:
    """For each part k (ids 1..len(names)) over the policy tokens (mask 1) labelled k: its share of the policy
    tokens, the mean advantage and mean |advantage|, the sampled tokens' mean surprisal (-log p, the policy's
    uncertainty there), the critic's mean value, and the mean advantage (and value) in episodes scored above / at
    most 0: a critic that reads the episode's progress has a value nearer each outcome at later parts.
    parts, mask, advantages, old_log_probs, values: (batch, response_len); scores: (batch,)."""
    policy = mask > 0
    total = float(policy.sum())
    out: dict[str, float] = {}
    if total == 0:
        return out
    for k, name in enumerate(names, start=1):
        sel = policy & (parts == k)  # (batch, response_len)
        n = float(sel.sum())
        if n == 0:
            continue
        p = f"part/{name}"
        out[f"{p}/share"] = n / total
        out[f"{p}/adv"] = float(advantages[sel].mean())
        out[f"{p}/adv_abs"] = float(advantages[sel].abs().mean())
        out[f"{p}/surprisal"] = float(-old_log_probs[sel].mean())
        if values is not None:
            out[f"{p}/value"] = float(values[sel].mean())
        if scores is not None:
            won = scores[:, None].expand_as(sel) > 0
            for tag, rows in (("won", won), ("lost", ~won)):
                m = sel & rows
                if m.any():
                    out[f"{p}/adv_{tag}"] = float(advantages[m].mean())
                    if values is not None:
                        out[f"{p}/value_{tag}"] = float(values[m].mean())
    return out


def object_column(rows: Sequence[Sequence[int]]) -> np.ndarray:
    """A ragged list of lists as a 1-d object array (numpy would make equal-length rows a 2-d array)."""
    col = np.empty(len(rows), dtype=object)
    for i, r in enumerate(rows):
        col[i] = list(r)
    return col
