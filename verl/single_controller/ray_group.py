"""Ray worker group: one Ray actor per rank, driven from a single controller process.

The actors are placed in one placement group (STRICT_PACK when a single node can hold
all of them, else PACK), get the torch.distributed env vars (MASTER_ADDR is the rank-0
actor's node, with a free port picked there) and then build the worker, all at once,
since joining the process group blocks until every rank has arrived. Calls dispatch by
the same @register metadata as SPMDWorkerGroup. `ray` is imported only here, lazily.
"""
from __future__ import annotations

import functools
import os
import socket
from typing import Any

from verl.single_controller.base import collect, dispatch_mode, split_args


class _Host:
    """Lives in a Ray actor and holds the worker of one rank."""

    def address(self) -> tuple[str, int]:
        import ray

        with socket.socket() as s:  # the OS picks a free port; it is released for the rank-0 worker to bind
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def start(self, worker_cls, env: dict, init_kwargs: dict) -> None:
        os.environ.update(env)
        self.worker = worker_cls(**init_kwargs)

    def call(self, method: str, args: tuple, kwargs: dict) -> Any:
        return getattr(self.worker, method)(*args, **kwargs)


class RayWorkerGroup:
    def __init__(self, worker_cls, world_size: int, init_kwargs: dict | None = None,
                 num_gpus_per_worker: int = 0, num_cpus_per_worker: int = 1, ready_timeout_s: float = 300,
                 call_timeout_s: float | None = None):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.worker_cls, self.world_size, self.call_timeout_s = worker_cls, world_size, call_timeout_s
        bundle = {"CPU": num_cpus_per_worker}
        if num_gpus_per_worker:
            bundle["GPU"] = num_gpus_per_worker
        strategy = "STRICT_PACK" if _fits_one_node(ray, bundle, world_size) else "PACK"
        self.placement_group = placement_group([dict(bundle)] * world_size, strategy=strategy)
        ray.get(self.placement_group.ready(), timeout=ready_timeout_s)
        remote_host = ray.remote(_Host)
        self.hosts = [
            remote_host.options(
                num_cpus=num_cpus_per_worker, num_gpus=num_gpus_per_worker,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.placement_group, placement_group_bundle_index=r),
            ).remote()
            for r in range(world_size)
        ]
        master_addr, master_port = ray.get(self.hosts[0].address.remote())
        starts = []
        for r, host in enumerate(self.hosts):
            env = {"RANK": str(r), "WORLD_SIZE": str(world_size), "MASTER_ADDR": master_addr,
                   "MASTER_PORT": str(master_port),
                   # Ray narrows CUDA_VISIBLE_DEVICES to the actor's own GPU, so it is device 0.
                   "LOCAL_RANK": "0"}
            starts.append(host.start.remote(worker_cls, env, init_kwargs or {}))
        ray.get(starts, timeout=ready_timeout_s)

    def call(self, method: str, *args, **kwargs) -> Any:
        """Run `method` on the actors as it was @register-ed; see verl.single_controller.base."""
        import ray

        mode = dispatch_mode(self.worker_cls, method)
        per_rank = split_args(mode, self.world_size, args, kwargs)
        refs = [host.call.remote(method, *part) for host, part in zip(self.hosts, per_rank) if part is not None]
        return collect(mode, ray.get(refs, timeout=self.call_timeout_s))

    def __getattr__(self, method: str):
        if method.startswith("_") or "worker_cls" not in self.__dict__:
            raise AttributeError(method)
        dispatch_mode(self.worker_cls, method)
        return functools.partial(self.call, method)

    def shutdown(self) -> None:
        """Kill the actors and free their placement group."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for host in self.hosts:
            ray.kill(host)
        remove_placement_group(self.placement_group)


def _fits_one_node(ray, bundle: dict, world_size: int) -> bool:
    for node in ray.nodes():
        if node.get("Alive") and all(node["Resources"].get(k, 0) >= v * world_size for k, v in bundle.items()):
            return True
    return False
