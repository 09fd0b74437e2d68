"""Learned routing baselines: who should get the question, decided without the policy.

knn, mlp     routers learned from the train split's per-model outcomes (router_r1/eval/learned_routers.py),
             cost-aware at the run's alpha; the question verbatim to the model they pick. One call.

The oracle baselines (oracle, oracle-hops) route by a simulated pool's answer key: its world supplies them
(router_r1/pool/world.py; the simulated world's are sim/oracle_baselines.py).

Every episode is written in the router's format and answered with the last reply's first sentence,
so the one scorer judges these as it judges the router.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from router_r1.eval.baselines import calls_episode, reply_answer, route_all
from router_r1.eval.embed import make_embedder
from router_r1.eval.learned_routers import KnnRouter, MlpRouter, Outcomes, choose, cost_bounds, select_k
from router_r1.pool.client import PoolClient, RouteRequest
from router_r1.pool.registry import ModelRegistry
from router_r1.reward.qa_em import em_score


def outcomes_key(registry: ModelRegistry, questions: list[str], golds: list[list[str]], pool_id: str) -> str:
    """What a cached outcome table depends on: the models (name, api id, prices, sampling, sim profile; not the
    endpoint, which changes with every sim server's port), `pool_id`, the questions and their golds."""
    doc = {"models": [[s.name, s.api_id, s.price_out_per_m, s.price_in_per_m, s.temperature, s.max_tokens, s.sim]
                      for s in registry.models.values()],
           "pool": pool_id, "questions": questions, "golds": golds}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def train_outcomes(client: PoolClient, registry: ModelRegistry, questions: list[str], golds: list[list[str]],
                   chunk: int, cache_dir: str | Path, pool_id: str, log=print) -> Outcomes:
    """Every model of `registry` asked every train question once (or the cached table for the same inputs)."""
    key = outcomes_key(registry, questions, golds, pool_id)
    path = Path(cache_dir) / f"train_outcomes-{key}.json"
    cached = Outcomes.load(path, key)
    if cached is not None:
        log(f"train outcomes: {path} (cached)")
        return cached
    models = registry.names
    correct = np.zeros((len(questions), len(models)))
    cost = np.zeros((len(questions), len(models)))
    failed = 0
    for j, m in enumerate(models):
        results = route_all(client, [RouteRequest(m, q) for q in questions], chunk)
        for i, r in enumerate(results):
            correct[i, j] = em_score(reply_answer(r.text if r.ok else None), golds[i])
            cost[i, j] = r.cost_usd
            failed += not r.ok
    out = Outcomes(models, list(questions), correct, cost)
    if failed:  # a table with failures is used once and not kept: the next run asks again
        log(f"train outcomes: {failed} of {correct.size} calls failed (counted as wrong); not cached")
    else:
        out.save(path, key)
        log(f"train outcomes: {len(questions)} questions x {len(models)} models -> {path}")
    return out


_EMBEDDED: dict = {}  # the last (embedder, train, test) embeddings: knn and mlp of one evaluation share them


def _embed(embedder: str, train: list[str], test: list[str]):
    key = (embedder, tuple(train), tuple(test))
    if key not in _EMBEDDED:
        emb = make_embedder(embedder).fit(train)
        _EMBEDDED.clear()
        _EMBEDDED[key] = (emb.name, emb.encode(train), emb.encode(test))
    return _EMBEDDED[key]


def learned_picks(kind: str, outcomes: Outcomes, questions: list[str], alpha: float, embedder: str = "auto",
                  k: int | None = None, seed: int = 0) -> tuple[list[str], str]:
    """The model the knn or mlp router picks for each question, and a line saying how it was made (knn without
    `k` chooses it by leave-one-out on the train split)."""
    name, train_x, test_x = _embed(embedder, outcomes.questions, questions)
    bounds = cost_bounds(outcomes.cost)
    how = ""
    if kind == "knn":
        if k is None:
            k, scores = select_k(train_x, outcomes, alpha, bounds)
            how = " (leave-one-out train reward " + ", ".join(f"k={kk}: {v:.3f}" for kk, v in scores.items()) + ")"
        router = KnnRouter(train_x, outcomes, k)
    else:
        router = MlpRouter(train_x, outcomes, seed=seed)
    p, c = router.estimate(test_x)
    picks = choose(p, c, alpha, bounds)
    detail = (f"{kind}{f' k={router.k}' if kind == 'knn' else ''} on {name}, {len(outcomes.questions)} train "
              f"questions x {len(outcomes.models)} models, alpha {alpha:g}{how}")
    return [outcomes.models[i] for i in picks], detail


def picked_episodes(label: str, picks: list[str], questions: list[str], client: PoolClient, chunk: int,
                    max_obs_length: int) -> list[dict]:
    """Each question verbatim to its picked model."""
    results = route_all(client, [RouteRequest(m, q) for m, q in zip(picks, questions)], chunk)
    return [calls_episode([(f"{label}: ask {m}", m, q, r)], max_obs_length)
            for m, q, r in zip(picks, questions, results)]
