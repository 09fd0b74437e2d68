"""This process's place in an SPMD (torchrun) launch, for the controller code.

Under torchrun every process runs the controller. Each one plays its own share of the
episodes (so a pool is called once per trajectory, not once per rank), then all
processes exchange the finished episodes, score the whole batch and continue with
identical batches.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from verl.trainer.env import RolloutResult


def _share(n: int, rank: int, world: int) -> slice:
    """Contiguous near-equal share of n items, rank order."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


@dataclass
class Dist:
    rank: int
    world_size: int

    def shard(self, rows: list) -> list:
        return rows[_share(len(rows), self.rank, self.world_size)]

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def gather_result(self, result: RolloutResult) -> RolloutResult:
        """Every rank's episodes, concatenated in rank order (ragged lists travel as objects)."""
        if self.world_size == 1:
            return result
        parts: list[RolloutResult] = [None] * self.world_size
        dist.all_gather_object(parts, result)
        return RolloutResult(
            prompt_ids=[x for p in parts for x in p.prompt_ids],
            response_ids=[x for p in parts for x in p.response_ids],
            response_mask=[x for p in parts for x in p.response_mask],
            info={k: [x for p in parts for x in p.info[k]] for k in result.info},
        )
