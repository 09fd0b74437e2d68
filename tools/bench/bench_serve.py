"""Load benchmark of the router server: N concurrent `openai` clients for a bounded time, then the same
questions through the evaluation path (RouterEnv in batches, no HTTP), side by side in one run.

    python -m tools.bench.bench_serve --checkpoint outputs/embedded/ppo --data outputs/embedded/data/test.parquet \
        --clients 8 --duration 60 --out docs/results/serve_cpu

Prints p50/p95/p99 request latency and throughput (questions/s) for the server, the evaluation path's
throughput on the questions the server answered, their ratio (the serving overhead), and the share of
answers that agree (greedy: they should all agree). The simulated pool is served in-process with
--sim-latency (0: the pool answers at once, so the numbers are the router's and the server's own).
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

from router_r1.eval.evaluate import find_data_files, load_rows
from router_r1.flags import add_flags, from_args
from router_r1.runtime import (EnvOverrides, load_policy, open_pool, quiet_transformers,
                               resolve_checkpoint)
from router_r1.serve import RouterServerThread, build_service
from router_r1.serve_engine import load_run_settings


def run_clients(url: str, questions: list[str], clients: int, duration_s: float, model: str,
                max_requests: int | None = None) -> list[dict]:
    """`clients` threads, each asking the next question in turn until the time (or request count) is up."""
    import openai

    lock, results, nxt = threading.Lock(), [], [0]
    deadline = time.monotonic() + duration_s

    def worker() -> None:
        c = openai.OpenAI(base_url=url, api_key="bench", max_retries=0, timeout=600)
        while time.monotonic() < deadline:
            with lock:
                if max_requests is not None and nxt[0] >= max_requests:
                    return
                i, nxt[0] = nxt[0], nxt[0] + 1
            q = questions[i % len(questions)]
            t0 = time.monotonic()
            try:
                r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": q}])
                ext = r.model_extra["router_r1"]
                rec = {"i": i, "ok": True, "answer": r.choices[0].message.content, "cost_usd": ext["cost_usd"],
                       "models": [c["model"] for c in ext["calls"]]}
            except openai.APIStatusError as e:  # the router gave no answer: counted, not fatal
                rec = {"i": i, "ok": False, "status": e.status_code}
            rec["latency_s"] = time.monotonic() - t0
            with lock:
                results.append(rec)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(results, key=lambda r: r["i"])


def bench(a: argparse.Namespace) -> dict:
    from router_r1.calibrate import router_records

    ckpt = resolve_checkpoint(a.checkpoint)
    settings = load_run_settings(ckpt, from_args(EnvOverrides, a))
    rows = load_rows(find_data_files([a.data]), a.limit)
    questions = [r.question for r in rows]
    quiet_transformers()
    with open_pool(a.pool or settings.pool, sim=True, sim_latency=a.sim_latency) as pool:
        policy = load_policy(ckpt, "cpu", max_batch_size=max(a.clients, 1))
        service = build_service(policy, pool, settings, max_batch=max(a.clients, 1))
        model = service.name
        with RouterServerThread(service) as srv:
            run_clients(srv.url, questions[:1], 1, 60.0, model, max_requests=1)  # warm-up: first-call costs
            batches_before = len(service.engine.batch_sizes)
            t0 = time.monotonic()
            served = run_clients(srv.url, questions, a.clients, a.duration, model, a.max_requests)
            serve_wall = time.monotonic() - t0
            batch_sizes = service.engine.batch_sizes[batches_before:]
        # the evaluation path on the questions the server was asked, in batches of --clients rows
        asked = [rows[r["i"] % len(rows)] for r in served]
        alpha = settings.alpha if settings.alphas else None
        # warm-up in this thread too (the first generate calls of a thread are slow), then the timed run
        router_records(policy, pool, asked[:2], service.env.cfg, alpha, "warm-up", batch_size=2)
        t0 = time.monotonic()
        records = router_records(policy, pool, asked, service.env.cfg, alpha, "eval", batch_size=max(a.clients, 1))
        eval_wall = time.monotonic() - t0
    lat = np.array([r["latency_s"] for r in served])
    ok = [r for r in served if r["ok"]]
    agree = [r["answer"] == rec["answer"] for r, rec in zip(served, records) if r["ok"]]
    out = {"checkpoint": str(ckpt), "data": a.data, "clients": a.clients, "duration_s": a.duration,
           "sim_latency": a.sim_latency, "settings": EnvOverrides.values_in(settings.env),
           "server": {"requests": len(served), "answered": len(ok), "wall_s": serve_wall,
                      "throughput_qps": len(served) / serve_wall,
                      "latency_s": {f"p{q}": float(np.percentile(lat, q)) for q in (50, 95, 99)},
                      "mean_generate_batch": float(np.mean(batch_sizes)) if batch_sizes else 0.0},
           "eval_path": {"questions": len(records), "wall_s": eval_wall, "throughput_qps": len(records) / eval_wall},
           "answers_agree": float(np.mean(agree)) if agree else None}
    out["serve_vs_eval_throughput"] = out["server"]["throughput_qps"] / out["eval_path"]["throughput_qps"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="a run's output dir (its hf/ export) or an HF model dir")
    p.add_argument("--data", required=True, help="questions (parquet with extra_info.question)")
    p.add_argument("--pool", default=None, help="pool yaml, served simulated (default: the run's, else sim.yaml)")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients (and rows per eval-path batch)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    p.add_argument("--max-requests", type=int, default=None, help="stop after this many requests")
    p.add_argument("--limit", type=int, default=None, help="first N questions of the file")
    p.add_argument("--sim-latency", type=float, default=0.0, help="scale of the simulated latencies (0: at once)")
    add_flags(p, EnvOverrides)
    p.add_argument("--out", default=None, help="write bench.json here")
    a = p.parse_args(argv)
    out = bench(a)
    s, e = out["server"], out["eval_path"]
    print(f"server: {s['requests']} requests from {a.clients} clients in {s['wall_s']:.1f}s, "
          f"{s['throughput_qps']:.2f} q/s, latency p50 {s['latency_s']['p50']:.3f}s p95 {s['latency_s']['p95']:.3f}s "
          f"p99 {s['latency_s']['p99']:.3f}s, mean generate batch {s['mean_generate_batch']:.1f}")
    print(f"eval path: {e['questions']} questions in {e['wall_s']:.1f}s, {e['throughput_qps']:.2f} q/s")
    print(f"serve / eval throughput: {out['serve_vs_eval_throughput']:.2f}x; answers agree: {out['answers_agree']}")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "bench.json").write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
