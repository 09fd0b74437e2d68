"""The decode step's linear layers as one split-K Triton GEMM (rollout.decode_linear=triton).

At decode a layer's matmul has a few dozen to 128 rows, so its time is reading the weight once. cuBLAS tiles
the output, and a 128 x 2,560 output (Qwen2.5-3B's q|k|v) makes ~20 tiles for 132 SMs: most of the GPU idles
and the weight streams at ~1 TB/s of the H200's 4.8 (docs/results/h200/decode_s7). Here the output is cut into
narrow column blocks and the reduction dimension into `split` slices, so that about TARGET_PROGRAMS programs
each stream their own piece of the weight; the slices' fp32 partial sums are added (with the bias) by a second
small kernel. Wrapped as a custom op so that torch.compile'd layer functions call it as one opaque node.
Measured slower than cuBLAS at Qwen2.5's shapes on an H200 (the partial sums move about as many bytes as the
weight: docs/results/h200/decode_s7), so it is an option, not the default.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 64            # output columns per program
BLOCK_K = 128           # reduction step
TARGET_PROGRAMS = 264   # about two programs per SM of an H100 / H200
MAX_ROWS = 128          # above this a GEMM is no longer a decode GEMM: F.linear
DEFAULT_TILE = dict(block_n=BLOCK_N, block_k=BLOCK_K, target=TARGET_PROGRAMS, num_warps=4, num_stages=3)
# the setting the custom op runs with (tools/bench/bench_decode_gemm.py sweeps it; bench_rollout --linear-tiles
# sets it from that sweep)
TILE = dict(DEFAULT_TILE)


@triton.jit
def _partial_kernel(X, W, B, OUT, M, N, K, sx_m, sw_n, so_s, so_m, K_SPLIT: tl.constexpr,
                    HAS_BIAS: tl.constexpr, DIRECT: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n, pid_s, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K_SPLIT, BLOCK_K):
        rk = pid_s * K_SPLIT + k0 + tl.arange(0, BLOCK_K)
        x = tl.load(X + rm[:, None] * sx_m + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        w = tl.load(W + rn[:, None] * sw_n + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0)
        acc += tl.dot(x, tl.trans(w))                                                   # (BLOCK_M, BLOCK_N)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if DIRECT:  # one slice: finish here
        if HAS_BIAS:
            acc += tl.load(B + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        tl.store(OUT + rm[:, None] * so_m + rn[None, :], acc.to(OUT.dtype.element_ty), mask=mask)
    else:       # fp32 partial sums, (splits, M, N)
        tl.store(OUT + pid_s * so_s + rm[:, None] * so_m + rn[None, :], acc, mask=mask)


@triton.jit
def _sum_kernel(P, B, OUT, MN, N, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLITS):
        acc += tl.load(P + s * MN + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(B + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(OUT + offs, acc.to(OUT.dtype.element_ty), mask=mask)


def plan(M: int, N: int, K: int, block_n: int = BLOCK_N, block_k: int = BLOCK_K,
         target: int = TARGET_PROGRAMS) -> tuple[int, int]:
    """(BLOCK_M, K per slice) for an (M, K) x (K, N) product: enough slices to reach ~target programs."""
    block_m = min(MAX_ROWS, max(16, triton.next_power_of_2(M)))
    columns = triton.cdiv(N, block_n) * triton.cdiv(M, block_m)
    split = max(1, min(triton.cdiv(K, block_k), round(target / columns)))
    return block_m, triton.cdiv(triton.cdiv(K, split), block_k) * block_k


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, block_n: int = BLOCK_N,
           block_k: int = BLOCK_K, target: int = TARGET_PROGRAMS, num_warps: int = 4,
           num_stages: int = 3) -> torch.Tensor:
    """x @ w.T + b. x: (..., K); w: (N, K), contiguous. Built for decode's few rows (the custom op's MAX_ROWS)."""
    *lead, K = x.shape
    N = w.shape[0]
    x2 = x.reshape(-1, K).contiguous()
    M = x2.shape[0]
    block_m, k_split = plan(M, N, K, block_n, block_k, target)
    splits = triton.cdiv(K, k_split)
    grid = (triton.cdiv(N, block_n), splits, triton.cdiv(M, block_m))
    out = torch.empty(M, N, device=x.device, dtype=x.dtype)
    bias = b if b is not None else out  # never read without HAS_BIAS
    opts = dict(HAS_BIAS=b is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
                num_stages=num_stages)
    if splits == 1:
        _partial_kernel[grid](x2, w, bias, out, M, N, K, x2.stride(0), w.stride(0), 0, out.stride(0), k_split,
                              DIRECT=True, **opts)
    else:
        part = torch.empty(splits, M, N, device=x.device, dtype=torch.float32)
        _partial_kernel[grid](x2, w, bias, part, M, N, K, x2.stride(0), w.stride(0), part.stride(0),
                              part.stride(1), k_split, DIRECT=False, **opts)
        block = 1024
        _sum_kernel[(triton.cdiv(M * N, block),)](part, bias, out, M * N, N, SPLITS=splits,
                                                   HAS_BIAS=b is not None, BLOCK=block)
    return out.reshape(*lead, N)


@torch.library.custom_op("verl::decode_linear", mutates_args=())
def decode_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """F.linear for the decode step: the split-K kernel up to MAX_ROWS rows, F.linear above."""
    if x.numel() // x.shape[-1] > MAX_ROWS:
        return torch.nn.functional.linear(x, w, b)
    return linear(x, w, b, **TILE)


@decode_linear.register_fake
def _(x, w, b):
    return x.new_empty(*x.shape[:-1], w.shape[0])
