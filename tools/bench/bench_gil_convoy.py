"""How much a thread of small torch ops slows beside a busy pure-Python thread, per interpreter switch
interval: the host-side contention suspected behind one-step off-policy PPO's slower update on one GPU
(docs/results/h200/async_lora_ray/README.md). Each small op releases the interpreter lock and must take it
back; a Python-bound thread beside it keeps the lock for up to a switch interval each time.

    python -m tools.bench.bench_gil_convoy [--ops 20000] [--intervals 0.005 0.0005 0.0001]

Prints, per interval, the ops' time alone and beside the Python thread, and the ratio.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import torch


def small_ops(n: int, x: torch.Tensor) -> float:
    start = time.perf_counter()
    for _ in range(n):
        x.add_(1.0)  # a launch-sized op: the lock is released around it and taken back
    return time.perf_counter() - start


def python_work(stop: threading.Event) -> None:
    """What the rollout thread's environment does between decode steps: plain Python (JSON, text)."""
    while not stop.is_set():
        for i in range(1000):
            json.dumps({"turn": i, "text": "<search>who founded it</search>" * 4})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=20000, help="small torch ops timed per setting")
    p.add_argument("--intervals", type=float, nargs="+", default=[0.005, 0.0005, 0.0001],
                   help="Python switch intervals (s) to try")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    x = torch.zeros(8)
    default = sys.getswitchinterval()
    try:
        for interval in args.intervals:
            sys.setswitchinterval(interval)
            alone = small_ops(args.ops, x)
            stop = threading.Event()
            worker = threading.Thread(target=python_work, args=(stop,))
            worker.start()
            time.sleep(0.05)
            beside = small_ops(args.ops, x)
            stop.set()
            worker.join()
            print(f"switch interval {interval * 1e3:.1f} ms: {args.ops} small ops alone {alone:.3f} s, "
                  f"beside a Python thread {beside:.3f} s ({beside / alone:.1f}x slower)")
    finally:
        sys.setswitchinterval(default)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
