"""SPMD worker group: for a torchrun launch, where every process runs the same controller code.

Each process holds one local worker. A "dp" call runs the local worker on this rank's
shard and all_gathers the (CPU) results, so every rank's controller sees the full
result and the controllers stay in lockstep. An "all" call runs the method on every
rank and returns the local result (collective methods give every rank the same answer
by construction; nothing is sent). A "rank0" call runs on rank 0 and broadcasts.
"""
from __future__ import annotations

import functools
from typing import Any

import torch.distributed as dist

from verl.protocol import DataProto
from verl.single_controller.base import collect, dispatch_mode, split_args


def _to_cpu(x: Any) -> Any:
    return x.to("cpu") if isinstance(x, DataProto) else x


class SPMDWorkerGroup:
    def __init__(self, worker):
        self.worker = worker
        self.rank, self.world_size = worker.rank, worker.world_size

    def call(self, method: str, *args, **kwargs) -> Any:
        """Run `method` the way it was @register-ed; see the module docstring."""
        mode = dispatch_mode(self.worker, method)
        fn = getattr(self.worker, method)
        if self.world_size == 1:
            return fn(*args, **kwargs)
        mine = split_args(mode, self.world_size, args, kwargs)[self.rank]
        if mode == "all":
            return fn(*mine[0], **mine[1])
        if mode == "rank0":
            box = [fn(*mine[0], **mine[1]) if self.rank == 0 else None]
            dist.broadcast_object_list(box, src=0)
            return box[0]
        result = _to_cpu(fn(*mine[0], **mine[1]))
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, result)
        return collect(mode, gathered)

    def __getattr__(self, method: str):
        if method.startswith("_") or "worker" not in self.__dict__:
            raise AttributeError(method)
        dispatch_mode(self.worker, method)  # fail now, not at call time, for a plain attribute
        return functools.partial(self.call, method)
