"""The decode attention alone: the Triton split-K kernel at several tile settings against the masked
matmul path, at a shape's batch and context, as KV bytes read per second.

    python -m tools.bench.bench_decode_attention --shape qwen2.5-3b --batch 128 --context 1280   # GPU
    python -m tools.bench.bench_decode_attention --tiny     # CPU smoke: Triton's interpreter, fp32, 2 rows

Every row attends its whole context (prompt = context - 1, one generated column); the KV bytes count
what the kernel must read (rows x kv heads x context x head dim x 2 tensors x 2 bytes) per layer.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time

import torch

# bench_rollout's shape names: importing it here would import triton before --tiny can turn the interpreter on
SHAPES = ("qwen2.5-0.5b", "qwen2.5-3b")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-3b"], choices=SHAPES,
                   help="model shapes (heads, kv heads, head dim)")
    p.add_argument("--batch", type=int, default=128, help="rows decoded together")
    p.add_argument("--context", type=int, default=1280, help="cache columns each row attends")
    p.add_argument("--blocks", type=int, nargs="+", default=[32, 64, 128], help="cache columns per inner step")
    p.add_argument("--targets", type=int, nargs="+", default=[512, 1024, 2048, 4096],
                   help="programs the span is split into, about")
    p.add_argument("--warps", type=int, nargs="+", default=[2, 4, 8], help="warps per program")
    p.add_argument("--stages", type=int, nargs="+", default=[0],
                   help="software-pipeline stages of the inner loop's loads (0: Triton's default)")
    p.add_argument("--tiny", action="store_true",
                   help="CPU smoke run in Triton's interpreter (fp32, 2 rows, context 200): checks, does not time")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    if args.tiny:
        # Triton reads TRITON_INTERPRET when it is imported, and bench_rollout's imports import it (torch._dynamo)
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError("bench_decode_attention --tiny: triton was imported without TRITON_INTERPRET=1")
        os.environ["TRITON_INTERPRET"] = "1"
        args.batch, args.context = 2, 200
    from tools.bench.bench_rollout import SHAPES as dims
    from verl.workers.rollout.static_rollout import matmul_decode_attention
    from verl.workers.rollout.triton_decode_attention import triton_decode_attention
    dev, dt = ("cpu", torch.float32) if args.tiny else ("cuda", torch.bfloat16)
    tol = 1e-4 if args.tiny else 1e-2  # a tile past it computes something else: it cannot be the best
    if args.tiny:
        def bench(fn):  # ms of one call: a smoke run times nothing worth reading
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
    else:
        import triton.testing
        bench = triton.testing.do_bench
    results = []
    for shape in args.shape:
        hidden, _, heads, kv, _ = dims[shape]
        D, rows, ctx = hidden // heads, args.batch, args.context
        span = math.ceil((ctx + 1) / 128) * 128
        q = torch.randn(rows, heads, 1, D, device=dev, dtype=dt)
        kc, vc = (torch.randn(rows, kv, span + 128, D, device=dev, dtype=dt) for _ in range(2))
        lengths = torch.full((rows,), ctx - 1, device=dev)
        pos, width, col = lengths.clone(), torch.tensor([ctx - 1], device=dev), torch.tensor([ctx - 1], device=dev)
        kv_bytes = rows * kv * ctx * D * 2 * 2
        bias = torch.zeros(rows, 1, 1, span, device=dev)
        bias[..., ctx:] = float("-inf")
        ms = bench(lambda: matmul_decode_attention(q, kc[:, :, :span], vc[:, :, :span], bias, D ** -0.5))
        ref = matmul_decode_attention(q, kc[:, :, :span], vc[:, :, :span], bias, D ** -0.5)
        row = {"shape": shape, "rows": rows, "context": ctx, "kv_mb": kv_bytes / 1e6, "matmul_us": ms * 1e3}
        print(f"{shape}: KV {kv_bytes / 1e6:.0f} MB a layer; matmul path {ms * 1e3:.1f} us "
              f"({kv_bytes / ms / 1e9:.2f} TB/s)", flush=True)
        best = None
        for block, target, warps, stages in itertools.product(args.blocks, args.targets, args.warps, args.stages):
            tile = dict(block=block, target=target, num_warps=warps, **({"num_stages": stages} if stages else {}))
            name = f"block {block} target {target} warps {warps} stages {stages or '-'}"
            fn = lambda: triton_decode_attention(q, kc, vc, lengths, pos, width, col, span, D ** -0.5,  # noqa: E731
                                                 **tile)
            try:
                err = (fn().float() - ref.float()).abs().max().item()
                t = bench(fn)
            except Exception as e:  # a tile that does not fit (shared memory) is a data point too
                print(f"  {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            key = f"triton_b{block}_t{target}_w{warps}" + (f"_s{stages}" if stages else "")
            row[f"{key}_us"] = t * 1e3
            print(f"  {name}: {t * 1e3:6.1f} us ({kv_bytes / t / 1e9:.2f} TB/s), max |diff| {err:.3g}", flush=True)
            row[f"{key}_maxdiff"] = err
            if err > tol:
                print(f"  {name}: MISMATCH, max |diff| {err:.3g}", flush=True)
                continue
            if best is None or t < best[0]:
                best = (t, tile, name)
        if best:
            print(f"  best: {best[2]}: {best[0] * 1e3:.1f} us, {ms / best[0]:.2f}x the matmul path", flush=True)
            row["best"] = dict(best[1], us=best[0] * 1e3)  # bench_rollout --tiles
        results.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
