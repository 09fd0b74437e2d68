"""SPMD controller helper: shares and the episode gather, over a real 2-process gloo group."""
import os
import socket

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from verl.trainer.dist import Dist
from verl.trainer.env_interface import RolloutResult


def test_shares_cover_every_row_once_in_order():
    rows = list(range(11))
    for world in (1, 2, 3, 4):
        parts = [Dist(r, world).shard(rows) for r in range(world)]
        assert [x for p in parts for x in p] == rows
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


def _episodes(mine, rank):
    return RolloutResult([[i] for i in mine], [[i] * (i + 1) for i in mine], [[1] * (i + 1) for i in mine],
                         info={"cost_usd": [0.1 * i for i in mine], "rank": [rank] * len(mine)})


def _gather(rank: int, world: int, port: int, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        d = Dist(rank, world)
        # contiguous shares, ragged: rank 0 gets 3 episodes, rank 1 gets 2
        full = d.gather_result(_episodes(d.shard(list(range(5))), rank))
        out[rank, "uniform"] = (full.prompt_ids, full.response_ids, full.info["cost_usd"])
        # shares by load: the gather must put the episodes back in row order
        loads = [1, 6, 1, 6, 2, 1, 3]
        plan = d.assignment(7, loads)
        full = d.gather_result(_episodes(d.shard(list(range(7)), loads), rank), plan)
        out[rank, "balanced"] = (plan, full.prompt_ids, full.response_ids, full.info["rank"])
    finally:
        dist.destroy_process_group()


def test_balanced_shares_by_load_cover_every_row_once():
    rows, loads = list("abcdef"), [6, 6, 1, 1, 1, 1]
    parts = [Dist(r, 2).shard(rows, loads) for r in range(2)]
    assert parts == [["a", "c", "e"], ["b", "d", "f"]]  # uniform would give rank 0 both 6s
    assert Dist(0, 2).assignment(6) == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="2 loads for 3 rows"):
        Dist(0, 2).shard([1, 2, 3], [1, 1])


def test_every_rank_gets_every_episode_in_row_order():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_gather, args=(2, port, out), nprocs=2, join=True)
    expected = ([[i] for i in range(5)], [[i] * (i + 1) for i in range(5)], [0.1 * i for i in range(5)])
    assert out[0, "uniform"] == out[1, "uniform"] == expected
    # By hand: 6 (#1) -> r0; 6 (#3) -> r1; 3 (#6) -> r0 (tie: lower rank) = 9; 2 (#4) -> r1 = 8;
    # 1 (#0) -> r1 = 9; 1 (#2) -> r0 (tie at 9: fewer requests) = 10; 1 (#5) -> r1 = 10.
    plan = [[1, 2, 6], [0, 3, 4, 5]]
    owner = [1, 0, 0, 1, 1, 1, 0]  # which rank played each row
    expected = (plan, [[i] for i in range(7)], [[i] * (i + 1) for i in range(7)], owner)
    assert out[0, "balanced"] == out[1, "balanced"] == expected
