"""Micro-batches: group rows by a token budget, trim all-padding columns or remove padding
by packing the rows into one, weight each loss.

Batch layout: `input_ids` / `attention_mask` / `position_ids` are (batch, prompt_len +
response_len), left-padded prompt then right-padded response; response-aligned tensors
(`responses`, `response_mask`, `old_log_probs`, ...) are (batch, response_len).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

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
    """Zero-pad a (batch, kept, ...) tensor on the right of dim 1 back to (batch, response_len, ...)."""
    return F.pad(x, (0, 0) * (x.ndim - 2) + (0, response_len - x.shape[1]))


@dataclass
class SharedPrefix:
    """A micro-batch as the prompt prefix its rows share plus each row's remainder (`split_shared_prefix`)."""

    prefix_ids: torch.Tensor  # (1, P)
    prefix_position_ids: torch.Tensor  # (1, P)
    input_ids: torch.Tensor  # (batch, S): each row's tokens after the prefix, left-aligned, right-padded
    attention_mask: torch.Tensor  # (batch, P + S): the prefix (all ones), then the remainder's real tokens
    position_ids: torch.Tensor  # (batch, S)
    index: torch.Tensor  # (n,): where the output scoring each real response token sits in the (batch * S) outputs
    real: torch.Tensor  # (batch, response_len): the real response tokens


def split_shared_prefix(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                        response_len: int) -> SharedPrefix | None:
    """The longest run of leading prompt tokens (and positions) every row shares, and each row's rest; None when
    the rows share nothing. Each row keeps at least its last prompt token, whose output scores its first response
    token, so every scoring output comes from the remainder."""
    batch, seq = input_ids.shape
    prompt_cols = seq - response_len
    lengths = attention_mask[:, :prompt_cols].sum(-1)  # (batch,) real prompt tokens (left-padded)
    starts = prompt_cols - lengths  # (batch,)
    span = int(lengths.min()) - 1
    if span < 1:
        return None
    cols = starts[:, None] + torch.arange(span, device=input_ids.device)  # (batch, span)
    toks, pos = input_ids.gather(1, cols), position_ids.gather(1, cols)
    same = ((toks == toks[:1]) & (pos == pos[:1])).all(0)  # (span,)
    shared = int(same.long().cumprod(0).sum())
    if shared == 0:
        return None
    offset = starts + shared  # (batch,): each row's first remainder column
    width = seq - int(offset.min())
    src = offset[:, None] + torch.arange(width, device=input_ids.device)  # (batch, width) source columns
    inside = src < seq
    src = src.clamp(max=seq - 1)
    rest_mask = attention_mask.gather(1, src) * inside
    real = attention_mask[:, prompt_cols:].bool()  # (batch, response_len)
    # The response token at column c is scored by the output at c - 1, which sits at c - 1 - offset in its row.
    score = torch.arange(prompt_cols - 1, seq - 1, device=input_ids.device)[None] - offset[:, None]
    rows = torch.arange(batch, device=input_ids.device)[:, None]
    return SharedPrefix(
        prefix_ids=toks[:1, :shared], prefix_position_ids=pos[:1, :shared],
        input_ids=input_ids.gather(1, src) * inside,
        attention_mask=torch.cat([rest_mask.new_ones(batch, shared), rest_mask], dim=1),
        position_ids=position_ids.gather(1, src), index=(rows * width + score)[real], real=real)


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


@dataclass
class Packed:
    """The real tokens of a micro-batch's rows, concatenated into one row."""

    input_ids: torch.Tensor  # (1, total)
    position_ids: torch.Tensor  # (1, total): each row's own positions, restarting per row
    cu_seqlens: torch.Tensor  # (rows + 1,) int32: where each row starts in the packed row
    max_len: int  # longest row, for varlen attention kernels


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> Packed:
    """Drop every padding token: rows (batch, seq) -> one row (1, total real tokens)."""
    real = attention_mask.bool()
    lengths = real.sum(-1)  # (batch,)
    if not bool((lengths > 0).all()):
        raise ValueError(f"rows {(lengths == 0).nonzero().flatten().tolist()} have no real token; cannot pack them")
    cu = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)  # (batch + 1,)
    return Packed(input_ids[real][None], position_ids[real][None], cu, int(lengths.max()))


def response_logit_index(attention_mask: torch.Tensor, response_len: int, packed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the output that scores each real response token sits: (flat index (n,), real (batch, response_len)).

    Position t's output predicts token t+1, so a response token at column c is scored by
    the last real token before it. The index points into the model's outputs flattened to
    (batch * seq, ...) for padded rows, or to (total, ...) for `pack_rows`' packed row.
    """
    batch, seq = attention_mask.shape
    real = attention_mask[:, seq - response_len :].bool()  # (batch, response_len)
    if packed:
        lengths = attention_mask.sum(-1)
        starts = lengths.cumsum(0) - lengths  # (batch,)
        pos = attention_mask.cumsum(-1) - 1 + starts[:, None]  # (batch, seq): packed index of real tokens
    else:
        pos = torch.arange(batch * seq, device=attention_mask.device).view(batch, seq)
    return pos[:, seq - response_len - 1 : -1][real], real
