"""The decode step's GEMMs alone: cuBLAS (F.linear) against the split-K Triton kernel
(rollout.decode_linear=triton) over a sweep of its settings, with --autotune torch.compile's max-autotune and with
--cublaslt the same F.linear through cuBLASLt, at a shape's decode batch, as weight bytes read per second and as ms
a step; --graph also times each GEMM inside a CUDA graph, as the rollout's step runs it (GPU only).

    python -m tools.bench.bench_decode_gemm --shape qwen2.5-3b --batch 128      # GPU
    python -m tools.bench.bench_decode_gemm --tiny                              # CPU smoke: checks, no timing

At 128 rows a decode GEMM is bound by reading its weight once, so the floor is weight bytes / HBM
bandwidth; a step runs every layer's GEMMs once and the LM head once.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time

import torch
import torch.nn.functional as F

from tools.bench.bench_rollout import SHAPES, hbm_bytes_per_s

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
    import functools
    import triton.testing
    return functools.partial(triton.testing.do_bench, warmup=5, rep=25)  # 18 settings x 10 GEMMs: keep it short


def sweep(tiny: bool) -> list[dict]:
    """The split-K kernel's settings to try: column block, reduction step, programs aimed at, pipeline stages."""
    if tiny:
        return [dict(block_n=32, block_k=64, target=8, num_warps=4, num_stages=1)]
    return [dict(block_n=bn, block_k=bk, target=t, num_warps=4, num_stages=3)
            for bn in (32, 64, 128) for bk in (64, 128) for t in (132, 264, 528)]


@contextlib.contextmanager
def blas_library(lib: str, on_gpu: bool = True):
    """F.linear through `lib` ("cublas" or "cublaslt") inside the block; off the GPU a no-op (CPU builds have
    neither)."""
    if not on_gpu:
        yield
        return
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(lib)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def in_graph(x: torch.Tensor, w: torch.Tensor, ref: torch.Tensor, calls: int, lib: str, bench) -> tuple[float, float]:
    """ms of one call and max |diff| from ref of F.linear(x, w) run `calls` times on distinct copies of w in one CUDA
    graph."""
    ws = [w.clone() for _ in range(calls)]  # a step reads each layer's own weight: none is in L2 when it runs
    with blas_library(lib):
        out = F.linear(x, ws[0])  # warm-up outside the capture: cuBLAS picks its kernel and workspace here
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for wi in ws:
                out = F.linear(x, wi)
        graph.replay()
        return bench(graph.replay) / calls, (out.float() - ref).abs().max().item()


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-3b"],
                   choices=[s for s in SHAPES if s != "tiny"], help="model shapes")
    p.add_argument("--batch", type=int, default=128, help="rows decoded together")
    p.add_argument("--tiny", action="store_true", help="CPU smoke run: fp32, 4 rows, shapes cut 16x, one setting "
                                                       "(the kernel runs in Triton's interpreter: TRITON_INTERPRET=1)")
    p.add_argument("--autotune", action="store_true",
                   help="also time torch.compile max-autotune (Inductor's Triton GEMM templates against cuBLAS)")
    p.add_argument("--cublaslt", action="store_true",
                   help="also time F.linear with torch.backends.cuda.preferred_blas_library('cublaslt'), whose "
                        "heuristics pick other kernels (its workspace: CUBLASLT_WORKSPACE_SIZE, KiB, read at start)")
    p.add_argument("--graph", action="store_true",
                   help="also time each GEMM as a step runs it: its calls on as many distinct weights (L2 holds none "
                        "of them) in one CUDA graph, per call; cuBLAS, and cuBLASLt with --cublaslt (GPU only: "
                        "--tiny skips it)")
    p.add_argument("--out", default=None, help="write the results as JSON here (with each shape's best setting)")
    args = p.parse_args(argv)
    from verl.workers.rollout import triton_decode_linear as tdl
    dev, dt = ("cpu", torch.float32) if args.tiny else ("cuda", torch.bfloat16)
    rows = 4 if args.tiny else args.batch
    bench = timer(args.tiny)
    # max-autotune without its CUDA graphs: the rollout captures its own graph around the whole step
    mode = "default" if args.tiny else "max-autotune-no-cudagraphs"
    tol = 1e-4 if args.tiny else 2e-2
    settings = sweep(args.tiny)
    paths = ["cublas", "splitk"] + (["autotuned"] if args.autotune else []) + (["cublaslt"] if args.cublaslt else [])
    if args.graph and not args.tiny:
        paths += ["cublas_graph"] + (["cublaslt_graph"] if args.cublaslt else [])
    bw = hbm_bytes_per_s()  # this device's datasheet bandwidth: H100 and H200 floors differ by 1.4x
    print(f"HBM floor at {bw / 1e12:.2f} TB/s ({torch.cuda.get_device_name() if dev == 'cuda' else 'no GPU'}; "
          "datasheet figures in bench_rollout.HBM_DATASHEET)")
    results = []
    for shape in args.shape:
        step = {name: 0.0 for name in paths + ["floor"]}
        per_setting = [0.0] * len(settings)  # a step's split-K time at each setting (a mismatch: cuBLAS's time)
        for name, k, n, calls in gemms(shape):
            if args.tiny:
                k, n = max(k // 16, 8), max(n // 16, 8)
            torch.manual_seed(0)
            x = torch.randn(rows, k, dtype=dt, device=dev)
            w = torch.randn(n, k, dtype=dt, device=dev) / k ** 0.5
            ref = F.linear(x, w).float()
            scale = max(1.0, ref.abs().max().item())
            ms = {"cublas": bench(lambda: F.linear(x, w))}
            diffs = {}
            if args.autotune:
                torch._dynamo.reset()
                tuned = torch.compile(F.linear, mode=mode, dynamic=False)
                diffs["autotuned"] = (tuned(x, w).float() - ref).abs().max().item()
                ms["autotuned"] = bench(lambda: tuned(x, w))
            if args.cublaslt:
                with blas_library("cublaslt", on_gpu=dev == "cuda"):  # the smoke run times the CPU path again
                    diffs["cublaslt"] = (F.linear(x, w).float() - ref).abs().max().item()
                    ms["cublaslt"] = bench(lambda: F.linear(x, w))
            for lib in ("cublas", "cublaslt"):
                if f"{lib}_graph" in paths:
                    ms[f"{lib}_graph"], diffs[f"{lib}_graph"] = in_graph(x, w, ref, calls, lib, bench)
            times = []
            for i, tile in enumerate(settings):
                diff = (tdl.linear(x, w, None, **tile).float() - ref).abs().max().item()
                t = bench(lambda: tdl.linear(x, w, None, **tile)) if diff <= tol * scale else float("inf")
                times.append((t, diff))
                per_setting[i] += calls * (t if t < float("inf") else ms["cublas"])
            best = min(range(len(settings)), key=lambda i: times[i][0])
            ms["splitk"], diffs["splitk"] = times[best]
            nbytes = (n * k + rows * k + rows * n) * x.element_size()
            floor_ms = nbytes / bw * 1e3
            row = dict(shape=shape, gemm=name, rows=rows, k=k, n=n, calls=calls, floor_ms=floor_ms,
                       maxdiff=max(diffs.values(), default=0.0), splitk_setting=settings[best])
            line = f"{shape:13} {name:8} {rows}x{k}->{n}:"
            for path in paths:
                ok = diffs.get(path, 0.0) <= tol * scale and ms[path] < float("inf")
                row[f"{path}_ms"], row[f"{path}_tb_s"] = ms[path], nbytes / ms[path] / 1e9
                step[path] += calls * (ms[path] if ok else ms["cublas"])
                line += f"  {path} {ms[path] * 1e3:7.1f} us ({row[f'{path}_tb_s']:.2f} TB/s)"
                line += "" if ok else f" MISMATCH (max diff {diffs.get(path, float('nan')):.3g})"
            step["floor"] += calls * floor_ms
            results.append(row)
            print(f"{line}  floor {floor_ms * 1e3:6.1f} us  (split-K best: {settings[best]})", flush=True)
        one = min(range(len(settings)), key=per_setting.__getitem__)
        results.append(dict(shape=shape, gemm="step", **{f"{k}_ms": v for k, v in step.items()},
                            best=settings[one], best_ms=per_setting[one], hbm_tb_s=bw / 1e12))
        print(f"{shape:13} a step's GEMMs: " + ", ".join(f"{k} {v:.3f} ms" for k, v in step.items())
              + f"; one split-K setting for all: {per_setting[one]:.3f} ms at {settings[one]} "
                f"(cuBLAS / that: {step['cublas'] / per_setting[one]:.2f}x)", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
