"""Micro-batches: pack rows by a token budget, trim all-padding columns, weight each loss.

Batch layout: `input_ids` / `attention_mask` / `position_ids` are (batch, prompt_len +
response_len), left-padded prompt then right-padded response; response-aligned tensors
(`responses`, `response_mask`, `old_log_probs`, ...) are (batch, response_len).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from verl.protocol import DataProto

SEQ_KEYS = ("input_ids", "attention_mask", "position_ids")


def make_micro_batches(data: DataProto, max_tokens_per_micro_batch: int, min_num: int = 1) -> list[np.ndarray]:
    """Row indices of at least `min_num` micro-batches whose real tokens (attention_mask.sum)
    fit the budget, balanced by greedy packing (longest row into the lightest micro-batch)."""
    lengths = data.batch["attention_mask"].sum(-1).tolist()
    budget = max_tokens_per_micro_batch
    for i, n in enumerate(lengths):
        if n > budget:
            raise ValueError(f"row {i} has {n} real tokens, more than max_tokens_per_micro_batch={budget}")
    if not 1 <= min_num <= len(lengths):
        raise ValueError(f"cannot make {min_num} non-empty micro-batches from {len(lengths)} rows")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    k = max(min_num, math.ceil(sum(lengths) / budget))
    while True:  # ends at the latest when every row has its own micro-batch
        bins, loads = [[] for _ in range(k)], [0] * k
        for i in order:
            b = min(range(k), key=lambda j: (loads[j], len(bins[j])))
            bins[b].append(i)
            loads[b] += lengths[i]
        if max(loads) <= budget:
            return [np.array(sorted(b)) for b in bins]
        k += 1


def split_rows(n: int, micro_batch_size: int, min_num: int = 1) -> list[np.ndarray]:
    """Consecutive micro-batches of about `micro_batch_size` rows, at least `min_num` of them."""
    k = max(min_num, math.ceil(n / micro_batch_size))
    if k > n:
        raise ValueError(f"cannot make {k} non-empty micro-batches from {n} rows")
    return np.array_split(np.arange(n), k)


def trim_padding(mb: DataProto) -> tuple[DataProto, int]:
    """Drop columns that are padding in every row; returns (trimmed batch, kept response length).

    Leading prompt columns and trailing response columns go; the last prompt column always
    stays since its logits predict the first response token. Every 2-D tensor that is not
    a SEQ_KEYS tensor must be response-aligned (select the keys you need first).
    """
    attn = mb.batch["attention_mask"]
    resp_len = mb.batch["responses"].shape[1]
    prompt_len = attn.shape[1] - resp_len
    if prompt_len < 1:
        raise ValueError(f"input_ids has {attn.shape[1]} columns, not more than responses' {resp_len}")
    used = attn.bool().any(0)  # (seq,)
    prompt_used = used[:prompt_len].nonzero()
    left = min(int(prompt_used[0]) if len(prompt_used) else prompt_len, prompt_len - 1)
    resp_used = used[prompt_len:].nonzero()
    keep = int(resp_used[-1]) + 1 if len(resp_used) else 1
    batch = {}
    for k, v in mb.batch.items():
        if k in SEQ_KEYS:
            v = v[:, left : prompt_len + keep]
        elif v.ndim >= 2:
            if v.shape[1] != resp_len:
                raise ValueError(f"tensor {k!r} has {v.shape[1]} columns; response-aligned tensors have {resp_len}")
            v = v[:, :keep]
        batch[k] = v
    return DataProto(batch, mb.non_tensor, mb.meta), keep


def pad_response(x: torch.Tensor, response_len: int) -> torch.Tensor:
    """Zero-pad a (batch, kept) tensor on the right back to (batch, response_len)."""
    return F.pad(x, (0, response_len - x.shape[1]))


def loss_units(response_mask: torch.Tensor, agg_mode: str) -> int:
    """What the loss aggregation averages over: policy tokens (token-mean), sequences with
    policy tokens (seq-mean-token-*), or all sequences (seq-mean-token-sum-norm).

    A micro-batch's loss weighted by units(micro) / units(mini-batch) sums to the loss
    of the whole mini-batch, however it was split.
    """
    m = response_mask.bool()
    if agg_mode == "token-mean":
        return int(m.sum())
    if agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        return int(m.any(-1).sum())
    if agg_mode == "seq-mean-token-sum-norm":
        return m.shape[0]
    raise ValueError(f"unknown loss_agg_mode {agg_mode!r}")
