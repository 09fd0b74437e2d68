"""Overhead of PoolClient per call, against raw aiohttp POSTs to the same server (the floor).

Both sides send the same chat request N times at concurrency C; rounds alternate so a
warming machine favours neither. By default the simulated pool server is started in
process with zero simulated latency, so what is left is HTTP + client cost:

    python -m tools.bench.bench_pool_client --n 2000 --concurrency 32
    python -m tools.bench.bench_pool_client --url http://127.0.0.1:8000/v1 --pool configs/pool/paper.yaml
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time

import aiohttp

from router_r1.pool.client import PoolClient, RouteRequest
from router_r1.pool.registry import ModelRegistry, ModelSpec
from router_r1.pool.messages import submodel_messages


async def raw_round(spec: ModelSpec, queries: list[str], concurrency: int) -> tuple[float, list[float], int]:
    """(wall seconds, per-call latencies, failures) for bare aiohttp POSTs."""
    url = spec.base_url.rstrip("/") + "/chat/completions"
    headers = {"Authorization": f"Bearer {spec.api_key()}"}
    slots = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        async def one(q: str) -> tuple[float, bool]:
            body = {"model": spec.api_id, "messages": submodel_messages(q),
                    "temperature": spec.temperature, "max_tokens": spec.max_tokens}
            t0 = time.perf_counter()  # queueing included, as in PoolResult.latency_s
            async with slots:
                async with session.post(url, json=body) as resp:
                    doc = await resp.json(content_type=None)
                    ok = resp.status == 200 and bool(doc.get("choices"))
                return time.perf_counter() - t0, ok

        t0 = time.perf_counter()
        out = await asyncio.gather(*(one(q) for q in queries))
        wall = time.perf_counter() - t0
    return wall, [lat for lat, _ in out], sum(not ok for _, ok in out)


async def client_round(client: PoolClient, model: str, queries: list[str]) -> tuple[float, list[float], int]:
    """(wall seconds, per-call latencies, failures) for PoolClient.route_batch."""
    t0 = time.perf_counter()
    res = await client.route_batch([RouteRequest(model, q) for q in queries])
    wall = time.perf_counter() - t0
    return wall, [r.latency_s for r in res], sum(not r.ok for r in res)


async def bench(registry: ModelRegistry, model: str, n: int, concurrency: int, rounds: int) -> None:
    spec = registry[model]
    client = PoolClient(registry, max_concurrency_per_endpoint=concurrency, timeout_s=60.0,
                        max_retries=0, deadline_s=3600.0)
    stats = {"raw aiohttp": [], "PoolClient": []}
    try:
        await raw_round(spec, ["warm-up"] * concurrency, concurrency)  # open the connections first
        await client_round(client, model, ["warm-up"] * concurrency)
        for r in range(rounds):
            # distinct queries, so no server-side cache favours either side
            queries = [f"round {r} question {i}: who wrote Hamlet?" for i in range(n)]
            stats["raw aiohttp"].append(await raw_round(spec, queries, concurrency))
            stats["PoolClient"].append(await client_round(client, model, queries))
    finally:
        await client.aclose()

    print(f"model {spec.name} at {spec.base_url}; {n} calls x {rounds} rounds, concurrency {concurrency}")
    print("latencies run from submission to result (queueing for a slot included)")
    print(f"{'':14s} {'wall_s':>8s} {'calls/s':>9s} {'wall_ms/call':>13s} {'mean_ms':>8s} {'p50_ms':>8s} "
          f"{'p95_ms':>8s} {'failed':>7s}")
    summary = {}
    for name, runs in stats.items():
        wall = statistics.median(w for w, _, _ in runs)
        lats = sorted(x for _, ls, _ in runs for x in ls)
        failed = sum(f for _, _, f in runs)
        mean, p50, p95 = statistics.fmean(lats), lats[len(lats) // 2], lats[int(0.95 * (len(lats) - 1))]
        summary[name] = (wall, mean)
        print(f"{name:14s} {wall:8.3f} {n / wall:9.0f} {1e3 * wall / n:13.3f} {1e3 * mean:8.2f} {1e3 * p50:8.2f} "
              f"{1e3 * p95:8.2f} {failed:7d}")
    (raw_wall, raw_mean), (cl_wall, cl_mean) = summary["raw aiohttp"], summary["PoolClient"]
    print(f"overhead PoolClient / raw: wall x{cl_wall / raw_wall:.2f}, mean latency x{cl_mean / raw_mean:.2f}, "
          f"+{1e3 * (cl_wall - raw_wall) / n:.3f} ms of wall time per call at concurrency {concurrency}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000, help="calls per round")
    ap.add_argument("--concurrency", type=int, default=32, help="calls in flight per endpoint")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds")
    ap.add_argument("--pool", default="configs/pool/sim.yaml",
                    help="pool yaml: the registry, and the simulated server's pool")
    ap.add_argument("--model", default=None, help="pool model to call (default: the first one)")
    ap.add_argument("--url", default=None, help="use this running server instead of starting the simulated one")
    args = ap.parse_args()

    with contextlib.ExitStack() as stack:
        url = args.url
        if url is None:
            try:
                from router_r1.pool.server import ServerThread
                from sim.backend import SimBackend  # the simulated pool
            except ImportError as e:
                sys.exit(f"cannot start the simulated pool ({e}); pass --url of a running server")

            backend = SimBackend.from_pool_yaml(args.pool, seed=0, latency_scale=0.0)
            url = stack.enter_context(ServerThread(backend, host="127.0.0.1", port=0, token=None)).url
        registry = ModelRegistry.from_yaml(args.pool, base_url=url)
        model = args.model or registry.names[0]
        asyncio.run(bench(registry, model, args.n, args.concurrency, args.rounds))


if __name__ == "__main__":
    main()
