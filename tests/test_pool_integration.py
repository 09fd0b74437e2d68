"""PoolClient against the real simulated pool server with 30% injected faults."""
from __future__ import annotations

import random
from pathlib import Path

from router_r1.pool.client import ERROR_KINDS, PoolClient, PoolResult, RouteRequest
from router_r1.pool.registry import ModelRegistry
from router_r1.pool.server import FaultConfig, ServerThread
from sim.backend import SimBackend
from router_r1.pool.messages import submodel_messages

SIM_YAML = Path(__file__).resolve().parents[1] / "configs" / "pool" / "sim.yaml"


def test_200_concurrent_calls_survive_a_faulty_pool():
    backend = SimBackend.from_pool_yaml(SIM_YAML, seed=0, latency_scale=0.02)
    # hangs last far longer than the client's per-call timeout, so they must be cut by it
    faults = FaultConfig(error_rate=0.1, rate_limit_rate=0.1, timeout_rate=0.1, hang_s=30.0,
                         retry_after_s=0.05, seed=3)
    deadline_s = 6.0
    rng = random.Random(0)
    questions = backend.world.questions(190, seed=9, split="test")
    with ServerThread(backend, faults=faults) as srv:
        registry = ModelRegistry.from_yaml(SIM_YAML, base_url=srv.url)
        reqs = [RouteRequest(rng.choice(registry.names), q.question) for q in questions]
        reqs += [RouteRequest("No-Such-Model", "hi")] * 10
        with PoolClient(registry, timeout_s=0.5, max_retries=4, backoff_base_s=0.02, backoff_max_s=0.2,
                        deadline_s=deadline_s, seed=0) as client:
            results = client.route(reqs)

    assert len(results) == len(reqs) and all(isinstance(r, PoolResult) for r in results)
    assert all(r.error == "unknown_model" for r in results[-10:])
    ok = [(req, r) for req, r in zip(reqs, results) if r.ok]
    assert len(ok) > len(reqs) // 2
    assert any(r.attempts > 1 for _, r in ok)  # faults were met and retried through
    for req, r in ok:
        spec = registry[req.model]
        text, prompt_tokens, completion_tokens = backend.respond(spec.api_id, submodel_messages(req.query),
                                                                 spec.max_tokens)
        assert (r.text, r.prompt_tokens, r.completion_tokens) == (text, prompt_tokens, completion_tokens)
        assert r.cost_usd == spec.output_cost(completion_tokens) > 0
        assert r.billed_usd == spec.cost(prompt_tokens, completion_tokens) > r.cost_usd
    for r in results:
        if not r.ok:
            assert r.text is None and r.cost_usd == 0 and r.error in ERROR_KINDS
