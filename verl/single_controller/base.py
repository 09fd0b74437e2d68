"""The Worker base class and the @register dispatch metadata shared by every worker group.

A worker is one process's share of a data-parallel model. The controller never calls
it directly: a worker group (SPMD under torchrun, or Ray actors) looks at how a method
was registered to decide what each rank receives and how the results come back:

  "dp"    every DataProto argument is split into world_size equal consecutive parts,
          rank r gets part r; DataProto results are concatenated in rank order and
          metric dicts are averaged over ranks (a `*_min` metric takes the minimum; a metric
          some ranks lack, having had nothing to measure, comes from the ranks that have it).
  "all"   every rank gets the same arguments (collective methods: init, checkpoints);
          the group returns rank 0's result.
  "rank0" only rank 0 runs the method (it must not use collectives).
"""
from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from verl.protocol import DataProto

DISPATCH_MODES = ("dp", "all", "rank0")


def register(dispatch: str = "all") -> Callable:
    """Mark a worker method as callable through a worker group, with its dispatch mode."""
    if dispatch not in DISPATCH_MODES:
        raise ValueError(f"dispatch must be one of {DISPATCH_MODES}, got {dispatch!r}")

    def mark(fn: Callable) -> Callable:
        fn.dispatch_mode = dispatch
        return fn

    return mark


def dispatch_mode(worker_or_cls: Any, method: str) -> str:
    fn = getattr(worker_or_cls, method, None)
    mode = getattr(fn, "dispatch_mode", None)
    if mode is None:
        name = worker_or_cls.__name__ if isinstance(worker_or_cls, type) else type(worker_or_cls).__name__
        raise AttributeError(f"{name}.{method} is not a @register-ed worker method")
    return mode


def split_args(mode: str, world_size: int, args: tuple, kwargs: dict) -> list[tuple[tuple, dict]]:
    """The (args, kwargs) each rank receives; for "rank0" only rank 0's entry is not None."""
    if mode == "all":
        return [(args, kwargs)] * world_size
    if mode == "rank0":
        return [(args, kwargs)] + [None] * (world_size - 1)

    def parts(x):
        if not isinstance(x, DataProto):
            return [x] * world_size
        if len(x) % world_size:
            raise ValueError(f"dp dispatch: a batch of {len(x)} rows does not split evenly over {world_size} ranks")
        return x.chunk(world_size)

    arg_parts = [parts(a) for a in args]
    kwarg_parts = {k: parts(v) for k, v in kwargs.items()}
    return [(tuple(p[r] for p in arg_parts), {k: p[r] for k, p in kwarg_parts.items()}) for r in range(world_size)]


def reduce_metric(key: str, values) -> float:
    """One metric over ranks or steps: the mean, or for a `*_min` metric the minimum."""
    return float(np.min(values) if key.endswith("_min") else np.mean(values))


def collect(mode: str, results: list) -> Any:
    """Merge per-rank results: see the module docstring."""
    if mode != "dp":
        return results[0]
    first = results[0]
    if first is None:
        return None
    if isinstance(first, DataProto):
        return DataProto.concat(results)
    if isinstance(first, dict):
        keys = dict.fromkeys(k for r in results for k in r)  # every rank's, in order
        return {k: reduce_metric(k, [r[k] for r in results if k in r]) for k in keys}
    return results


class Worker:
    """One rank: reads the torch.distributed env vars, joins the process group, picks its device
    (`device` None: CUDA when available, else CPU)."""

    def __init__(self, device: str | None = None):
        self.rank = _env_int("RANK", 0)
        self.world_size = _env_int("WORLD_SIZE", 1)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"RANK={self.rank} is outside WORLD_SIZE={self.world_size}")
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if device == "cuda":
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        elif device == "cpu":
            self.device = torch.device("cpu")
        else:
            raise ValueError(f"device must be 'cuda', 'cpu' or None (auto), got {device!r}")
        if self.world_size > 1 and not dist.is_initialized():
            for key in ("MASTER_ADDR", "MASTER_PORT"):
                if not os.environ.get(key):
                    raise ValueError(f"{key} must be set when WORLD_SIZE={self.world_size}")
            if os.environ["MASTER_PORT"] == "0":  # every rank would wait on port 0 forever
                raise ValueError("MASTER_PORT=0: torchrun passes --master_port=0 through to the workers; "
                                 "use `torchrun --standalone` or a real port")
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, rank=self.rank, world_size=self.world_size)

    def all_reduce(self, value: float, op: str = "sum") -> float:
        """Sum or max of a number over ranks (the number itself when there is one rank)."""
        if self.world_size == 1:
            return value
        t = torch.tensor(float(value), dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return t.item()

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()


def _env_int(key: str, default: int) -> int:
    raw = os.environ.get(key)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {key}={raw!r} is not an integer") from None
