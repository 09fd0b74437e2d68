"""This process's place in an SPMD (torchrun) launch, for the controller code.

Under torchrun every process runs the controller. Each one plays its own share of the
episodes (so a pool is called once per trajectory, not once per rank), then all
processes exchange the finished episodes and continue with identical batches.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
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

    def gather_episodes(self, result: RolloutResult, scores, metrics: dict[str, list], uids: list):
        """Concatenate every rank's episodes in rank order (ragged lists travel as objects)."""
        if self.world_size == 1:
            return result, scores, metrics, uids
        parts = [None] * self.world_size
        dist.all_gather_object(parts, (result, list(np.asarray(scores).tolist()), metrics, uids))
        merged = RolloutResult(
            prompt_ids=[p for r, *_ in parts for p in r.prompt_ids],
            response_ids=[p for r, *_ in parts for p in r.response_ids],
            response_mask=[p for r, *_ in parts for p in r.response_mask],
            info={k: [v for r, *_ in parts for v in r.info[k]] for k in result.info},
        )
        all_scores = [s for _, sc, _, _ in parts for s in sc]
        all_metrics = {k: [v for _, _, m, _ in parts for v in m[k]] for k in metrics}
        all_uids = [u for *_, us in parts for u in us]
        return merged, all_scores, all_metrics, all_uids
