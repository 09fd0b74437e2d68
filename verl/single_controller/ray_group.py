"""Ray worker group: one Ray actor per rank, hosting every role of that rank (colocated).

As in veRL's colocated worker groups, the actor, the reference policy, the critic and
the rollout engine of one rank live in one Ray actor (one process, one CUDA context,
one torch.distributed process group shared by the roles), built by the same worker
classes that the torchrun path uses. The controller sees one view per role
(`group.role("critic")`) with the calling interface of SPMDWorkerGroup.

Before anything is placed, the request (workers x CPUs/GPUs, nodes) is compared with
`ray.cluster_resources()` and a request that cannot fit fails at once with both
numbers. The actors go into one placement group (STRICT_PACK on one node, else PACK, or
the strategy asked for), get the torch.distributed env vars (MASTER_ADDR is the rank-0
actor's node, with a free port picked there) and then build their roles, all at once,
since joining the process group blocks until every rank has arrived. A rank that dies
or raises surfaces as a WorkerError naming the role, rank and node. `ray` is imported
only here, lazily.
"""
from __future__ import annotations

import functools
import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl.single_controller.base import collect, dispatch_mode, split_args

STRATEGIES = ("auto", "STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD")


class ResourceError(RuntimeError):
    """The cluster cannot hold what the run asks for."""


class WorkerError(RuntimeError):
    """A rank died or raised; the message names role, rank and node."""


@dataclass
class RayPlacement:
    """What each rank asks for and how the ranks spread over the nodes."""

    world_size: int
    num_cpus_per_worker: float = 1
    num_gpus_per_worker: float = 0
    nnodes: int = 1
    strategy: str = "auto"            # auto: STRICT_PACK when one node holds every rank, else PACK
    ready_timeout_s: float = 300      # placement and worker start-up
    call_timeout_s: float | None = None


class _Host:
    """Lives in a Ray actor and holds the workers (roles) of one rank."""

    def address(self) -> tuple[str, int]:
        import ray

        with socket.socket() as s:  # the OS picks a free port; it is released for the rank-0 worker to bind
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def node(self) -> str:
        """Address and short id of this actor's node (several nodes can share one address in a test)."""
        import ray

        return f"{ray.util.get_node_ip_address()}/{ray.get_runtime_context().get_node_id()[:8]}"

    def can_read(self, path: str) -> bool:
        return Path(path).exists()

    def start(self, roles: dict[str, tuple[type, dict]], env: dict) -> None:
        os.environ.update(env)
        self.workers = {name: cls(**kwargs) for name, (cls, kwargs) in roles.items()}

    def call(self, role: str, method: str, args: tuple, kwargs: dict) -> Any:
        return getattr(self.workers[role], method)(*args, **kwargs)


class RayWorkerGroup:
    """`roles` maps a role name to (worker class, init kwargs); every rank hosts all of them."""

    def __init__(self, roles: dict[str, tuple[type, dict]], placement: RayPlacement):
        import ray

        self.roles, self.placement = dict(roles), placement
        self.world_size = placement.world_size
        bundle = {"CPU": placement.num_cpus_per_worker}
        if placement.num_gpus_per_worker:
            bundle["GPU"] = placement.num_gpus_per_worker
        check_resources(ray.cluster_resources(), _alive_nodes(ray), bundle, placement)
        strategy = placement.strategy
        if strategy == "auto":
            strategy = "STRICT_PACK" if _fits_one_node(ray, bundle, self.world_size) else "PACK"
        self.placement_group, self.hosts = _place(ray, bundle, strategy, placement)
        try:
            self._start(ray, placement)
        except BaseException:
            # A group that never started must not keep its bundles: the next group (a retry, the next test)
            # would wait for CPUs nobody uses.
            self.shutdown()
            raise

    def _start(self, ray, placement: RayPlacement) -> None:
        self.nodes = ray.get([h.node.remote() for h in self.hosts], timeout=placement.ready_timeout_s)
        master_addr, master_port = ray.get(self.hosts[0].address.remote())
        starts = []
        for r, host in enumerate(self.hosts):
            env = {"RANK": str(r), "WORLD_SIZE": str(self.world_size), "MASTER_ADDR": master_addr,
                   "MASTER_PORT": str(master_port),
                   # Ray narrows CUDA_VISIBLE_DEVICES to the actor's own GPU, so it is device 0.
                   "LOCAL_RANK": "0"}
            starts.append(host.start.remote(self.roles, env))
        self._get(starts, "start", role=",".join(self.roles), timeout=placement.ready_timeout_s)

    def role(self, name: str) -> "RoleView":
        """The calling interface of one role (what the trainer holds as `groups[name]`)."""
        if name not in self.roles:
            raise KeyError(f"no role {name!r} in this group (roles: {sorted(self.roles)})")
        return RoleView(self, name)

    def call(self, role: str, method: str, *args, **kwargs) -> Any:
        """Run `role.method` on the ranks as it was @register-ed; see verl.single_controller.base."""
        mode = dispatch_mode(self.roles[role][0], method)
        per_rank = split_args(mode, self.world_size, args, kwargs)
        ranks = [r for r, part in enumerate(per_rank) if part is not None]
        refs = [self.hosts[r].call.remote(role, method, *per_rank[r]) for r in ranks]
        return collect(mode, self._get(refs, f"{role}.{method}", role=role, ranks=ranks))

    def check_shared_dir(self, path: str | os.PathLike) -> None:
        """Fail naming the node when `path` (made here, on the driver) is not visible from every rank."""
        import ray

        path = Path(path).resolve()
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".shared_check_{uuid.uuid4().hex}"
        probe.write_text("")
        try:
            seen = ray.get([h.can_read.remote(str(probe)) for h in self.hosts], timeout=self.placement.ready_timeout_s)
        finally:
            probe.unlink()
        blind = sorted({self.nodes[r] for r, ok in enumerate(seen) if not ok})
        if blind:
            raise ResourceError(f"trainer.output_dir={path} is not visible from node(s) {', '.join(blind)}: "
                                "checkpoints are written by every rank, so it must be on storage all nodes share")

    def shutdown(self) -> None:
        """Kill the actors and free their placement group."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for host in self.hosts:
            ray.kill(host)
        self.hosts = []
        remove_placement_group(self.placement_group)

    def _get(self, refs: list, what: str, role: str, ranks: list[int] | None = None, timeout: float | None = None):
        """Results in order; the first rank that dies or raises fails the call at once (the others may be
        blocked in a collective waiting for it, so waiting for every result in order could hang)."""
        import time

        import ray

        ranks = list(range(len(refs))) if ranks is None else ranks
        timeout = self.placement.call_timeout_s if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        index = {ref: i for i, ref in enumerate(refs)}
        results, pending = {}, list(refs)
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not ready:
                late = [ranks[index[ref]] for ref in pending]
                raise WorkerError(f"{what}: role {role!r} rank(s) {late} gave no answer within {timeout} s")
            i = index[ready[0]]
            try:
                results[i] = ray.get(ready[0])
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as e:
                rank = ranks[i]
                nodes = getattr(self, "nodes", [])
                node = nodes[rank] if rank < len(nodes) else "?"
                verb = "died" if isinstance(e, ray.exceptions.RayActorError) else "raised"
                raise WorkerError(f"{what}: role {role!r} rank {rank} on node {node} {verb}: {_last_line(e)}") from e
        return [results[i] for i in range(len(refs))]


class RoleView:
    """One role of a colocated group, called like a worker group: `view.update_actor(batch)`."""

    def __init__(self, group: RayWorkerGroup, role: str):
        self.group, self.name = group, role
        self.worker_cls = group.roles[role][0]
        self.world_size = group.world_size

    def call(self, method: str, *args, **kwargs) -> Any:
        return self.group.call(self.name, method, *args, **kwargs)

    def __getattr__(self, method: str):
        if method.startswith("_") or "worker_cls" not in self.__dict__:
            raise AttributeError(method)
        dispatch_mode(self.worker_cls, method)  # fail now, not at call time, for a plain attribute
        return functools.partial(self.call, method)


def check_resources(total: dict, nodes: list[dict], bundle: dict, placement: RayPlacement) -> None:
    """Raise ResourceError, with both numbers, when the request cannot fit the cluster."""
    n = placement.world_size
    for key, per_worker in bundle.items():
        need, have = per_worker * n, total.get(key, 0)
        if need > have:
            hint = " (set trainer.num_cpus_per_worker lower)" if key == "CPU" else ""
            raise ResourceError(f"the run asks for {n} workers x {per_worker:g} {key} = {need:g} {key}; "
                                f"the Ray cluster has {have:g} {key} in all{hint}")
    if placement.nnodes > len(nodes):
        raise ResourceError(f"the run asks for trainer.nnodes={placement.nnodes}; the Ray cluster has "
                            f"{len(nodes)} alive node(s)")
    if placement.strategy == "STRICT_SPREAD" and n > len(nodes):
        raise ResourceError(f"STRICT_SPREAD puts each of {n} workers on its own node; the cluster has {len(nodes)}")


def _place(ray, bundle: dict, strategy: str, placement: RayPlacement):
    from ray.util.placement_group import placement_group, placement_group_table
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if strategy not in STRATEGIES[1:]:
        raise ValueError(f"placement strategy must be one of {STRATEGIES}, got {strategy!r}")
    n = placement.world_size
    pg = placement_group([dict(bundle)] * n, strategy=strategy)
    try:
        ray.get(pg.ready(), timeout=placement.ready_timeout_s)
    except ray.exceptions.GetTimeoutError:
        state = placement_group_table(pg).get("state")
        raise ResourceError(f"{n} bundles of {bundle} ({strategy}) could not be placed within "
                            f"{placement.ready_timeout_s} s (state {state}); the cluster has "
                            f"{ray.cluster_resources()}") from None
    remote_host = ray.remote(_Host)
    hosts = [remote_host.options(
        num_cpus=placement.num_cpus_per_worker, num_gpus=placement.num_gpus_per_worker,
        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r),
    ).remote() for r in range(n)]
    return pg, hosts


def _alive_nodes(ray) -> list[dict]:
    return [node for node in ray.nodes() if node.get("Alive")]


def _fits_one_node(ray, bundle: dict, world_size: int) -> bool:
    return any(all(node["Resources"].get(k, 0) >= v * world_size for k, v in bundle.items())
               for node in _alive_nodes(ray))


def _last_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[-1] if text else type(e).__name__
