"""The cost knob at serving time: the same test questions asked of a running router server (router_r1.serve) as
`router-r1@A` for each alpha A, one request per question, a few at a time; per alpha: EM, mean cost, call shares.

    python -m experiments.gemma_alpha.serve_alpha_demo --url http://127.0.0.1:18080/v1 --data test.parquet \
        --alphas 0 0.3 0.6 0.9 --n 60 --out serve_demo.json

The requests are tools/bench/bench_serve.py's clients (the openai SDK); waits up to --wait-s for the server to come up.
"""
from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from router_r1.reward.qa_em import em_score
from tools.bench.bench_serve import run_clients


def wait_for(url: str, wait_s: float) -> list[str]:
    """The server's model ids, once GET /models answers (SystemExit after wait_s)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=5) as r:
                return [m["id"] for m in json.load(r)["data"]]
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() > deadline:
                raise SystemExit(f"error: no router server answered at {url}/models within {wait_s:.0f} s") from None
            time.sleep(2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the router server's /v1 base URL")
    p.add_argument("--data", required=True, help="a sim.qa parquet (extra_info.question, reward_model golds)")
    p.add_argument("--alphas", type=float, nargs="+", required=True, help="ask as router-r1@A for each")
    p.add_argument("--n", type=int, default=60, help="the first N questions")
    p.add_argument("--clients", type=int, default=16, help="requests in flight")
    p.add_argument("--wait-s", type=float, default=300.0, help="how long to wait for the server to start")
    p.add_argument("--out", required=True, help="JSON file for the per-alpha table and every reply")
    a = p.parse_args()
    rows = pq.read_table(a.data).to_pylist()[:a.n]
    ids = wait_for(a.url, a.wait_s)
    print(f"server models: {ids}")
    result = {"url": a.url, "data": a.data, "n": len(rows), "alphas": {}}
    for alpha in a.alphas:
        model = f"{ids[0].split('@')[0]}@{alpha:g}"
        questions = [r["extra_info"]["question"] for r in rows]
        replies = run_clients(a.url, questions, a.clients, 3600.0, model, max_requests=len(rows))  # in question order
        ok = [(r, row) for r, row in zip(replies, rows) if r["ok"]]
        em = sum(em_score(r["answer"], row["reward_model"]["ground_truth"]["target"]) for r, row in ok) / len(rows)
        calls = Counter(m for r, _ in ok for m in r["models"])
        total = sum(calls.values()) or 1
        line = {"model": model, "em": em, "cost_1e6_usd": 1e6 * sum(r["cost_usd"] for r, _ in ok) / len(rows),
                "errors": len(rows) - len(ok), "call_share": {m: c / total for m, c in calls.most_common()},
                "replies": replies}
        result["alphas"][f"{alpha:g}"] = line
        shares = ", ".join(f"{m} {s:.2f}" for m, s in line["call_share"].items())
        print(f"{model}: EM {em:.3f}, cost {line['cost_1e6_usd']:.2f}e-6 USD/q, errors {line['errors']}; calls: {shares}")
    Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
