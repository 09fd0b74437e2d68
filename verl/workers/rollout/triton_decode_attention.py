"""Decode attention as one split-K Triton kernel over StaticRollout's cache ("flash decoding").

The matmul path (static_rollout.matmul_decode_attention) reads every cache column of the bucket, padding and
future columns included, writes the (rows, heads, span) scores, softmaxes them in a second kernel and
multiplies in a third, with a -inf bias built per step. Here one program per (row, kv head, split of the
span) loads only the columns the row may attend, [0, prompt length) and [width, col] (masked loads: the
padding and the columns not yet written cost no memory traffic), once for all the query heads that share
that kv head, with an online softmax; a second small kernel merges the splits.
The row's prompt length, the batch's prompt width and the current column are read from device memory,
so a captured CUDA graph replays it as the cache fills.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

BLOCK_N = 32            # cache columns per inner step (H200 sweep: docs/results/h200/decode_s6)
TARGET_PROGRAMS = 512  # programs the span is split into, about (the same sweep: 1.55x faster than 64 / 1024 at 3B)


@triton.jit
def _split_kernel(Q, K, V, LEN, POS, WIDTH, COL, M_OUT, L_OUT, ACC_OUT,
                  sq_r, sq_h, sk_r, sk_h, sk_c, sv_r, sv_h, sv_c,
                  scaling, window, SPLIT: tl.constexpr,
                  G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                  SLIDING: tl.constexpr):
    r, h, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    length, width, col = tl.load(LEN + r), tl.load(WIDTH), tl.load(COL)
    g, d = tl.arange(0, G_PAD), tl.arange(0, D)
    q = tl.load(Q + r * sq_r + (h * G + g)[:, None] * sq_h + d[None, :], mask=(g < G)[:, None], other=0.0)
    q = (q.to(tl.float32) * scaling).to(K.dtype.element_ty)                       # (G_PAD, D)
    r64 = r.to(tl.int64)  # a cache of rows x kv x columns x D can pass 2^31 elements
    kbase, vbase = K + r64 * sk_r + h * sk_h, V + r64 * sv_r + h * sv_h
    m = tl.full([G_PAD], -1.0e30, tl.float32)
    l = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D], tl.float32)
    for start in range(0, SPLIT, BLOCK):
        cols = s * SPLIT + start + tl.arange(0, BLOCK)
        # the prompt's columns [0, length) and the generated ones [width, col]; a masked-off column is
        # never loaded, so padding and not-yet-written columns cost no memory traffic
        ok = (cols < length) | ((cols >= width) & (cols <= col))
        if SLIDING:  # also drop columns whose position is `window` or more behind the query's
            col_pos = tl.where(cols < width, cols, length + cols - width)
            ok = ok & (tl.load(POS + r) - col_pos < window)
        k = tl.load(kbase + cols[:, None] * sk_c + d[None, :], mask=ok[:, None], other=0.0)  # (BLOCK, D)
        scores = tl.where(ok[None, :], tl.dot(q, tl.trans(k)), float("-inf"))   # (G_PAD, BLOCK) fp32
        m_new = tl.maximum(m, tl.max(scores, 1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        v = tl.load(vbase + cols[:, None] * sv_c + d[None, :], mask=ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    out = (r * tl.num_programs(1) * G + h * G + g) * tl.num_programs(2) + s          # (rows, heads, splits)
    tl.store(M_OUT + out, m, mask=g < G)
    tl.store(L_OUT + out, l, mask=g < G)
    tl.store(ACC_OUT + out[:, None] * D + d[None, :], acc, mask=(g < G)[:, None])


@triton.jit
def _merge_kernel(M_IN, L_IN, ACC_IN, O, n_split, S_PAD: tl.constexpr, D: tl.constexpr):
    rh = tl.program_id(0)                                                          # row * heads + head
    s, d = tl.arange(0, S_PAD), tl.arange(0, D)
    ok = s < n_split
    m = tl.load(M_IN + rh * n_split + s, mask=ok, other=-1.0e30)
    l = tl.load(L_IN + rh * n_split + s, mask=ok, other=0.0)
    acc = tl.load(ACC_IN + (rh * n_split + s)[:, None] * D + d[None, :], mask=ok[:, None], other=0.0)
    w = tl.exp(m - tl.max(m, 0))                                                   # (S_PAD,) a split with no column: 0
    o = tl.sum(acc * w[:, None], 0) / tl.sum(l * w, 0)
    tl.store(O + rh * D + d, o.to(O.dtype.element_ty))


def splits_for(rows: int, kv: int, span: int, block: int = BLOCK_N, target: int = TARGET_PROGRAMS) -> tuple[int, int]:
    """(columns per split, number of splits) for a (rows, kv heads, span) step: about `target` programs."""
    want = max(1, min(math.ceil(span / block), math.ceil(target / (rows * kv))))
    split = math.ceil(span / want / block) * block
    return split, math.ceil(span / split)


def triton_decode_attention(q, k_cache, v_cache, lengths, pos, width, col, span: int, scaling: float,
                            window: int | None = None, block: int = BLOCK_N, target: int = TARGET_PROGRAMS,
                            num_warps: int = 4, num_stages: int | None = None) -> torch.Tensor:
    """One new query per row over the cache: q (rows, heads, 1, D); k_cache, v_cache (rows, kv, max_len, D);
    lengths, pos (rows,) prompt lengths and query positions; width, col (1,) on the device. -> (rows, heads, 1, D).
    block, target, num_warps and num_stages (software-pipelined loads in flight; None: Triton's default) tune the
    split kernel (tools/bench/bench_decode_attention.py)."""
    rows, heads, _, D = q.shape
    kv = k_cache.shape[1]
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("triton_decode_attention: the head dimension must be contiguous")
    split, n_split = splits_for(rows, kv, span, block, target)
    m = torch.empty((rows, heads, n_split), dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    acc = torch.empty((rows, heads, n_split, D), dtype=torch.float32, device=q.device)
    G = heads // kv
    _split_kernel[(rows, kv, n_split)](
        q, k_cache, v_cache, lengths, pos, width, col, m, l, acc,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        scaling, window or 0, SPLIT=split,
        G=G, G_PAD=max(16, triton.next_power_of_2(G)), D=D, BLOCK=block, SLIDING=window is not None,
        num_warps=num_warps, **({} if num_stages is None else {"num_stages": num_stages}))
    out = torch.empty((rows, heads, 1, D), dtype=q.dtype, device=q.device)
    _merge_kernel[(rows * heads,)](m, l, acc, out, n_split, S_PAD=max(2, triton.next_power_of_2(n_split)), D=D)
    return out
