"""Baselines through the same pool and the same scorer as the router.

direct        the policy answers alone: its prompt says that no model may be consulted
              (turn budget 0) and the rollout executes no route (max_turns 0).
largest:NAME  the question itself goes to one named pool model and its reply is the answer;
single:NAME   the same for any pool model; all-singles runs every model the router may call.
prompt-llm    the policy writes one turn on its usual prompt: if the turn routes, that
              model is the pick and the whole question goes to it, its reply being the
              answer; if the turn answers, that answer stands (no help needed).
oracle, oracle-hops, knn, mlp
              routing baselines without the policy: the oracles are a simulated pool's world's
              (router_r1/pool/world.py), knn and mlp router_r1/eval/routing_baselines.py's;
              `routers` asks for all four, `all` for them and all-singles.

Where a pool reply is the answer it is cut to its first sentence (reply_answer): SQuAD EM
of a whole, verbose reply almost never matches, and both the sub-model prompt and the sim
experts put the answer first. These episodes are written in the router's own format
(think, route, information, answer), so one scorer judges every method alike.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from router_r1.pool.client import PoolClient, PoolResult, RouteRequest
from router_r1.pool.registry import ModelRegistry
from router_r1.pool.world import ORACLE_KINDS
from router_r1.prompts import build_router_prompt
from router_r1.actions import format_observation, neutralize_tags, parse_action, render_route

POLICY_KINDS = ("direct", "prompt-llm")
ROUTER_KINDS = (*ORACLE_KINDS, "knn", "mlp")  # routing baselines that need no policy
GROUPS = {"routers": ROUTER_KINDS, "all": ("all-singles", *ROUTER_KINDS)}
DIRECT_MAX_TURNS = 0  # the rollout executes no route: the first turn must answer

_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s|\n")
_ANSWER_PREFIX = re.compile(r"^answer\s*:\s*", re.IGNORECASE)


class BaselineError(ValueError):
    """A --baseline value that cannot be used; the message names it."""


@dataclass(frozen=True)
class Baseline:
    kind: str  # direct | prompt-llm | largest | single | oracle | oracle-hops | knn | mlp
    model: str | None = None  # canonical pool name for largest/single

    @property
    def label(self) -> str:
        return self.kind if self.model is None else f"{self.kind}:{self.model}"

    @property
    def needs_policy(self) -> bool:
        return self.kind in POLICY_KINDS


def parse_baselines(specs: list[str], full: ModelRegistry, routable: ModelRegistry) -> list[Baseline]:
    """--baseline values -> Baselines; NAME resolves in the whole pool, all-singles expands over `routable`."""
    out: list[Baseline] = []
    for spec in [s for g in specs for s in GROUPS.get(g, (g,))]:
        kind, colon, name = spec.partition(":")
        if kind in (*POLICY_KINDS, *ROUTER_KINDS) and not colon:
            out.append(Baseline(kind))
        elif kind == "all-singles" and not colon:
            out += [Baseline("single", m) for m in routable.names]
        elif kind in ("largest", "single") and name.strip():
            found = full.resolve(name)
            if found is None:
                raise BaselineError(f"--baseline {spec}: no model {name!r} in pool {full.source} "
                                    f"(known: {', '.join(full.names)})")
            out.append(Baseline(kind, found.name))
        else:
            raise BaselineError(f"--baseline {spec!r}: expected direct, prompt-llm, largest:NAME, single:NAME, "
                                f"all-singles, {', '.join(ROUTER_KINDS)}, routers or all")
    return list(dict.fromkeys(out))  # all-singles plus single:X would run X twice


def reply_answer(text: str | None) -> str:
    """A pool reply's answer: its first sentence (or line), without an "Answer:" prefix or end punctuation."""
    if not text:
        return ""
    first = _SENTENCE_END.split(_ANSWER_PREFIX.sub("", text.strip()), maxsplit=1)[0]
    return first.strip().rstrip(".!?;:,").strip()


def direct_messages(question: str, registry: ModelRegistry, template: str | None = None) -> list[dict]:
    """The router's prompt with a turn budget of 0 ("answer on your own") where the template has {budget}."""
    budget = 0 if template is None or "{budget}" in template else None
    return build_router_prompt(question, registry, template, turn_budget=budget)


def routed_episode(think: str, model: str, question: str, result: PoolResult, max_obs_length: int,
                   generated: str | None = None) -> dict:
    """An episode that asked `model` the whole `question` and answers with its reply's first sentence."""
    return calls_episode([(think, model, question, result)], max_obs_length, generated=generated)


def calls_episode(calls: list[tuple[str, str, str, PoolResult]], max_obs_length: int,
                  generated: str | None = None) -> dict:
    """An episode of pool calls (think, model, query, result) in order, answering with the last reply's first
    sentence; `generated` is the policy's text of the first turn where a policy wrote it."""
    text, turns, answer = "", [], ""
    for i, (think, model, query, result) in enumerate(calls):
        reply = result.text if result.ok else None
        answer = neutralize_tags(reply_answer(reply))
        route = render_route(model, neutralize_tags(" ".join(query.split())))
        think = neutralize_tags(think.strip()) or f"ask {model}"  # the format needs a non-empty think
        text += f"<think>{think}</think>{route}{format_observation(reply, max_obs_length)}"
        turns.append({"generated": generated if generated is not None and i == 0 else f"<think>{think}</think>{route}",
                      "action": "route", "model": model, "query": query, "answer": None, "reason": None,
                      "ok": result.ok, "error": result.error, "cost_usd": result.cost_usd,
                      "billed_usd": result.billed_usd, "prompt_tokens": result.prompt_tokens,
                      "completion_tokens": result.completion_tokens,
                      "latency_s": result.latency_s, "server_s": result.server_s, "information": result.text,
                      "cached": result.cached, "cut": result.cut, "usage_capped": result.usage_capped})
    text += f"<answer>{answer}</answer>"
    turns.append({"generated": None, "action": "answer", "model": None, "query": None, "answer": answer,
                  "reason": "first sentence of the last reply"})
    results = [c[3] for c in calls]
    return {"text": text, "turns": turns, "cost_usd": sum(r.cost_usd for r in results),
            "billed_usd": sum(r.billed_usd for r in results), "route_count": len(calls),
            "pool_latency_s": sum(r.latency_s for r in results), "pool_failures": sum(not r.ok for r in results),
            "hit_budget": False, "truncated": False}


def route_all(client: PoolClient, reqs: list[RouteRequest], chunk: int) -> list[PoolResult]:
    """The requests, `chunk` at a time (route() puts one deadline on a whole batch), results in order."""
    out: list[PoolResult] = []
    for i in range(0, len(reqs), chunk):
        out += client.route(reqs[i:i + chunk])
    return out


def single_model_episodes(client: PoolClient, model: str, questions: list[str], chunk: int,
                          max_obs_length: int) -> list[dict]:
    """largest / single: every question to `model`, its reply's first sentence as the answer."""
    results = route_all(client, [RouteRequest(model, q) for q in questions], chunk)
    return [routed_episode(f"ask {model}", model, q, r, max_obs_length) for q, r in zip(questions, results)]


def prompt_llm_episodes(prompts: list[list[int]], questions: list[str], generate, sampling, tokenizer,
                        registry: ModelRegistry, client: PoolClient, max_obs_length: int) -> list[dict]:
    """One policy turn per prompt; a route picks the model that gets the whole question (one batch)."""
    outs = generate(prompts, sampling)
    texts = [tokenizer.decode(o.token_ids, skip_special_tokens=True) for o in outs]
    actions = [parse_action(t, registry) for t in texts]
    picked = [i for i, a in enumerate(actions) if a.kind == "route"]
    results = dict(zip(picked, client.route([RouteRequest(actions[i].model, questions[i]) for i in picked])))
    episodes = []
    for i, (text, action) in enumerate(zip(texts, actions)):
        if i in results:
            think = _THINK.search(text)
            episodes.append(routed_episode(think.group(1) if think else "", action.model, questions[i],
                                           results[i], max_obs_length, generated=text))
            continue
        # No pick: the turn is the whole episode (an answer is scored as it stands).
        turn = {"generated": text, "action": action.kind, "model": action.model, "query": action.query,
                "answer": action.answer, "reason": action.reason}
        episodes.append({"text": text, "turns": [turn], "cost_usd": 0.0, "billed_usd": 0.0, "route_count": 0,
                         "pool_latency_s": 0.0, "pool_failures": 0, "hit_budget": False, "truncated": False})
    return episodes
