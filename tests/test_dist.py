"""SPMD controller helper: shares and the episode gather, over a real 2-process gloo group."""
import os
import socket

import torch.distributed as dist
import torch.multiprocessing as mp

from verl.trainer.dist import Dist
from verl.trainer.env import RolloutResult


def test_shares_cover_every_row_once_in_order():
    rows = list(range(11))
    for world in (1, 2, 3, 4):
        parts = [Dist(r, world).shard(rows) for r in range(world)]
        assert [x for p in parts for x in p] == rows
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


def _gather(rank: int, world: int, port: int, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        d = Dist(rank, world)
        mine = d.shard(list(range(5)))  # ragged: rank 0 gets 3 episodes, rank 1 gets 2
        result = RolloutResult([[i] for i in mine], [[i] * (i + 1) for i in mine], [[1] * (i + 1) for i in mine],
                               info={"cost_usd": [0.1 * i for i in mine]})
        full = d.gather_result(result)
        out[rank] = (full.prompt_ids, full.response_ids, full.info["cost_usd"])
    finally:
        dist.destroy_process_group()


def test_every_rank_gets_every_episode_in_rank_order():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_gather, args=(2, port, out), nprocs=2, join=True)
    expected = ([[i] for i in range(5)], [[i] * (i + 1) for i in range(5)], [0.1 * i for i in range(5)])
    assert out[0] == out[1] == expected
