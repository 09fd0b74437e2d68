"""The oracle routing baselines: who should get the question, read from the simulated world's answer key.

oracle       the question, verbatim, to the cheapest expert that knows it (sim/truth.py; for one fact, the
             domain's cheap specialist; for two facts asked whole, the strong generalist whose expected
             P(right) is best). One call.
oracle-hops  the ceiling of a decomposing router: each fact's one-hop question to the cheapest expert
             that knows its domain, hop 2 asking about the entity hop 1's reply named (right or wrong).
             One call per fact.

Evaluation's `--baseline oracle` / `oracle-hops` reach these through the pool's world (sim/plugin.py);
their episodes are written as router_r1/eval/baselines.py writes every baseline's.
"""
from __future__ import annotations

from router_r1.eval.baselines import BaselineError, calls_episode, reply_answer, route_all
from router_r1.pool.client import PoolClient, RouteRequest
from sim.truth import SimTruth


def _facts(truth: SimTruth, question: str, where: str, label: str):
    facts = truth.facts(question)
    if facts is None:
        raise BaselineError(f"{where}: the {label} baseline cannot read the question {question!r} in the simulated "
                            f"world (seed {truth.world.seed}); is --sim-seed the data's world seed?")
    return facts


def oracle_episodes(truth: SimTruth, models: list[str], questions: list[str], wheres: list[str],
                    client: PoolClient, chunk: int, max_obs_length: int) -> list[dict]:
    """oracle: each question verbatim to the cheapest of `models` that knows it."""
    picks = [truth.pick(_facts(truth, q, w, "oracle"), models) for q, w in zip(questions, wheres)]
    results = route_all(client, [RouteRequest(m, q) for m, q in zip(picks, questions)], chunk)
    return [calls_episode([(f"oracle: {m} knows this", m, q, r)], max_obs_length)
            for m, q, r in zip(picks, questions, results)]


def oracle_hops_episodes(truth: SimTruth, models: list[str], questions: list[str], wheres: list[str],
                         client: PoolClient, chunk: int, max_obs_length: int) -> list[dict]:
    """oracle-hops: one call per fact, each to the cheapest of `models` that knows the fact's domain."""
    chains = [_facts(truth, q, w, "oracle-hops") for q, w in zip(questions, wheres)]
    calls: list[list[tuple]] = [[] for _ in questions]
    subjects = [chain[0].subject for chain in chains]
    for hop in range(max(len(c) for c in chains)):
        todo = [i for i, c in enumerate(chains) if hop < len(c) and subjects[i]]  # an empty reply ends the chain
        reqs = []
        for i in todo:
            fact = chains[i][hop]
            reqs.append(RouteRequest(truth.pick([fact], models), truth.hop_question(fact, subjects[i])))
        for i, req, res in zip(todo, reqs, route_all(client, reqs, chunk)):
            calls[i].append((f"oracle: hop {hop + 1} to {req.model}", req.model, req.query, res))
            subjects[i] = reply_answer(res.text if res.ok else None)
    return [calls_episode(c, max_obs_length) for c in calls]


ORACLES = {"oracle": oracle_episodes, "oracle-hops": oracle_hops_episodes}  # router_r1's ORACLE_KINDS
