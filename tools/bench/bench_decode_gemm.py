"""The decode step's GEMMs alone: cuBLAS (F.linear, what StaticRollout runs) against torch.compile's
max-autotune (Inductor benchmarks its Triton GEMM templates beside cuBLAS and keeps the faster), at a
shape's decode batch, as weight bytes read per second and as ms a step.

    python -m tools.bench.bench_decode_gemm --shape qwen2.5-3b --batch 128      # GPU
    python -m tools.bench.bench_decode_gemm --tiny                              # CPU smoke: checks, no timing

At 128 rows a decode GEMM is bound by reading its weight once, so the floor is weight bytes / HBM
bandwidth; a step runs every layer's GEMMs once and the LM head once.
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from tools.bench.bench_rollout import HBM_BYTES_PER_S, SHAPES

VOCAB = 151936  # Qwen2.5's, as bench_rollout builds its models


def gemms(shape: str) -> list[tuple[str, int, int, int]]:
    """(name, in features, out features, calls a step) of a Qwen2.5 shape, q|k|v and gate|up fused as we run them."""
    h, layers, heads, kv, inter = SHAPES[shape]
    qkv = (heads + 2 * kv) * (h // heads)
    return [("qkv", h, qkv, layers), ("o", h, h, layers), ("gate_up", h, 2 * inter, layers),
            ("down", inter, h, layers), ("lm_head", h, VOCAB, 1)]


def timer(tiny: bool):
    if tiny:
        def bench(fn):  # ms of one call: a smoke run times nothing worth reading
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
        return bench
    import triton.testing
    return triton.testing.do_bench


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-3b"],
                   choices=[s for s in SHAPES if s != "tiny"], help="model shapes")
    p.add_argument("--batch", type=int, default=128, help="rows decoded together")
    p.add_argument("--tiny", action="store_true", help="CPU smoke run: fp32, 4 rows, shapes cut 16x, no autotune")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    dev, dt = ("cpu", torch.float32) if args.tiny else ("cuda", torch.bfloat16)
    rows = 4 if args.tiny else args.batch
    bench = timer(args.tiny)
    # max-autotune without its CUDA graphs: the rollout captures its own graph around the whole step
    mode = "default" if args.tiny else "max-autotune-no-cudagraphs"
    tol = 1e-4 if args.tiny else 2e-2
    results = []
    for shape in args.shape:
        step = {"cublas": 0.0, "autotuned": 0.0, "floor": 0.0}
        for name, k, n, calls in gemms(shape):
            if args.tiny:
                k, n = max(k // 16, 8), max(n // 16, 8)
            torch.manual_seed(0)
            x = torch.randn(rows, k, dtype=dt, device=dev)
            w = torch.randn(n, k, dtype=dt, device=dev) / k ** 0.5
            torch._dynamo.reset()
            tuned = torch.compile(F.linear, mode=mode, dynamic=False)
            ref = F.linear(x, w).float()
            diff = (tuned(x, w).float() - ref).abs().max().item()
            ms_cublas = bench(lambda: F.linear(x, w))
            ms_tuned = bench(lambda: tuned(x, w))
            nbytes = (n * k + rows * k + rows * n) * x.element_size()
            floor_ms = nbytes / HBM_BYTES_PER_S * 1e3
            row = dict(shape=shape, gemm=name, rows=rows, k=k, n=n, calls=calls, cublas_ms=ms_cublas,
                       autotuned_ms=ms_tuned, floor_ms=floor_ms, maxdiff=diff,
                       cublas_tb_s=nbytes / ms_cublas / 1e9, autotuned_tb_s=nbytes / ms_tuned / 1e9)
            results.append(row)
            ok = diff <= tol * max(1.0, ref.abs().max().item())
            step["cublas"] += calls * ms_cublas
            step["autotuned"] += calls * (ms_tuned if ok else ms_cublas)
            step["floor"] += calls * floor_ms
            print(f"{shape:13} {name:8} {rows}x{k}->{n}: cuBLAS {ms_cublas * 1e3:8.1f} us ({row['cublas_tb_s']:.2f} TB/s)"
                  f"  autotuned {ms_tuned * 1e3:8.1f} us ({row['autotuned_tb_s']:.2f} TB/s)"
                  f"  floor {floor_ms * 1e3:7.1f} us{'' if ok else f'  MISMATCH (max diff {diff:.3g})'}", flush=True)
        results.append(dict(shape=shape, gemm="step", **{f"{k}_ms": v for k, v in step.items()}))
        print(f"{shape:13} a step's GEMMs: cuBLAS {step['cublas']:.3f} ms, autotuned {step['autotuned']:.3f} ms, "
              f"floor {step['floor']:.3f} ms ({step['cublas'] / step['autotuned']:.2f}x)", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
