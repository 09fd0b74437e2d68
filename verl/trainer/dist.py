"""This process's place in an SPMD (torchrun) launch, for the controller code.

Under torchrun every process runs the controller. Each one plays its own share of the
episodes (so a pool is called once per trajectory, not once per rank), then all
processes exchange the finished episodes, score the whole batch and continue with
identical batches. When rows carry a load hint (balance.row_loads), the shares are
balanced by load instead of cut into contiguous chunks; the gather restores row order.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from verl.trainer.balance import assign_balanced, assign_uniform
from verl.trainer.env_interface import RolloutResult


@dataclass
class Dist:
    rank: int
    world_size: int

    def assignment(self, n: int, loads: list[float] | None = None) -> list[list[int]]:
        """Row indices per rank: contiguous chunks, or least-loaded-first when per-row loads are given."""
        if loads is None:
            return assign_uniform(n, self.world_size)
        if len(loads) != n:
            raise ValueError(f"{len(loads)} loads for {n} rows")
        return assign_balanced(loads, self.world_size)

    def shard(self, rows: list, loads: list[float] | None = None) -> list:
        """This rank's rows (see assignment)."""
        return [rows[i] for i in self.assignment(len(rows), loads)[self.rank]]

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def gather_result(self, result: RolloutResult, assignment: list[list[int]] | None = None) -> RolloutResult:
        """Every rank's episodes in the original row order, given the assignment that made the
        shares (None: contiguous chunks, so rank order is row order). Ragged lists travel as objects."""
        if self.world_size == 1:
            return result
        parts: list[RolloutResult] = [None] * self.world_size
        dist.all_gather_object(parts, result)
        row_of = [i for share in assignment for i in share] if assignment is not None else None

        def cat(column) -> list:
            flat = [x for p in parts for x in column(p)]  # rank order
            if row_of is None:
                return flat
            if len(flat) != len(row_of):
                raise ValueError(f"gathered {len(flat)} episodes but the assignment has {len(row_of)} rows")
            out = [None] * len(flat)
            for row, x in zip(row_of, flat):
                out[row] = x
            return out

        return RolloutResult(
            prompt_ids=cat(lambda p: p.prompt_ids),
            response_ids=cat(lambda p: p.response_ids),
            response_mask=cat(lambda p: p.response_mask),
            info={k: cat(lambda p, k=k: p.info[k]) for k in result.info},
        )
