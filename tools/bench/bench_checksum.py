"""What the checkpoint manifest's checksums cost: hashing throughput here, extrapolated to a 3B run.

    python -m tools.bench.bench_checksum --mb 1024

Writes a file of real float32 tensor bytes, reads it once to warm the page cache (a save hashes
what it just wrote, which is usually still cached), then times verl.trainer.checkpoint's
file_digest (xxh3-128) and hashlib's sha256 over the same file, side by side. Disk reads on a
cold resume add the disk's own read time (which loading the checkpoint pays anyway).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
from pathlib import Path

import torch

from verl.trainer.checkpoint import file_digest

QWEN25_3B_PARAMS = 3.09e9  # Qwen2.5-3B-Instruct, the paper's policy and critic


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
    return h.hexdigest()


def best_rate(fn, path: Path, repeats: int) -> float:
    size = path.stat().st_size
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(path)
        best = min(best, time.perf_counter() - t0)
    return size / best / 1e9  # GB/s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=1024, help="test file size in MB")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per size")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "shard.bin"
        torch.manual_seed(0)
        n = args.mb * (1 << 20) // 4
        path.write_bytes(torch.randn(n, dtype=torch.float32).numpy().tobytes())
        path.read_bytes()  # page cache
        rates = {"xxh3_128": best_rate(file_digest, path, args.repeats),
                 "sha256": best_rate(sha256_file, path, args.repeats)}
    print(f"{args.mb} MB file, best of {args.repeats}, one thread, {os.cpu_count()} cores here:")
    for name, r in rates.items():
        print(f"  {name:<9} {r:6.2f} GB/s")
    print(f"  xxh3_128 / sha256: {rates['xxh3_128'] / rates['sha256']:.1f}x")
    # The actor keeps fp32 master weights and AdamW's two fp32 moments: 12 bytes per parameter;
    # the critic (same backbone) as much again. bf16 weights alone would be 2 bytes per parameter.
    sizes = {"3B actor + critic (fp32 weights + AdamW)": 2 * 12 * QWEN25_3B_PARAMS,
             "3B actor only": 12 * QWEN25_3B_PARAMS,
             "3B bf16 weights only": 2 * QWEN25_3B_PARAMS}
    print("extrapolated, hashed once at save and once at resume; the shard files hash in parallel, one thread each")
    print("(2 files on one GPU: actor, critic; 16 on 8 ranks, if that many cores and the disk keep up):")
    for label, size in sizes.items():
        xs = size / rates["xxh3_128"] / 1e9
        print(f"  {label:<42} {size / 1e9:5.1f} GB: xxh3 {xs:6.1f} s on one thread, {xs / 2:5.1f} s as 2 files, "
              f"{xs / 16:5.1f} s as 16; sha256 {size / rates['sha256'] / 1e9:6.1f} s on one thread")

if __name__ == "__main__":
    main()
