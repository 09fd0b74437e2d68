"""Simulated pool experts: each model answers chat requests from the SimWorld.

Whether expert M knows fact F is a seed-stable coin (sha256 of world seed, M, F) held
against M's accuracy for F's domain, so an expert is consistent: asked the same thing
twice, it gives the same reply (right, "I don't know", or the same hallucination).
A whole two-hop question is answered right only if the expert knows both facts AND
passes its multi-hop coin, so splitting a question into hops helps cheap experts.
Sampling temperature and request seed do not change what an expert knows.
"""
from __future__ import annotations

import asyncio
import math
import os
import random
from dataclasses import dataclass, field, fields

from router_r1.pool.registry import ModelRegistry, RegistryError
from sim.world import (DOMAINS, RELATIONS, Fact, Relation, SimWorld, count_tokens,
                                      stable_int, stable_unit, truncate_tokens)

# Verbosity pads replies with these (our wording); a wordier model costs more per call.
FILLER = (
    "I hope this helps.",
    "This matches the records I was trained on.",
    "Reference works generally agree on this point.",
    "Let me know if you would like more background.",
    "It is a question people ask fairly often.",
    "Please check a primary source if precision matters.",
    "There is a good deal of history behind this.",
    "The details are covered in most standard references.",
    "I can expand on related facts if that is useful.",
    "Several accounts describe this in more depth.",
)
CANT_TELL = ("I'm sorry, I can't tell what you are asking. Please name the person, place or "
             "thing you mean and the one fact you want to know about it.")


class SimProfileError(RegistryError):
    """A `sim:` block that cannot be used; the message names the file, model and field."""


@dataclass(frozen=True)
class LatencyProfile:
    """Seconds per call: lognormal time to first token, a rare heavy tail, then decoding."""

    median_s: float = 0.3
    sigma: float = 0.4
    tail_prob: float = 0.02
    tail_mult: float = 6.0
    tokens_per_s: float = 100.0

    def sample(self, rng: random.Random, completion_tokens: int) -> float:
        first = self.median_s * math.exp(self.sigma * rng.gauss(0.0, 1.0))
        if rng.random() < self.tail_prob:
            first *= self.tail_mult
        return first + completion_tokens / self.tokens_per_s


@dataclass(frozen=True)
class SimProfile:
    """How one simulated expert behaves. Probabilities are in [0, 1]."""

    accuracy: dict[str, float]  # domain -> P(knows a fact of that domain)
    multi_hop: float = 0.3  # P(composes two known facts when asked a two-hop question whole)
    idk_rate: float = 0.5  # P(says "I don't know" | does not know); otherwise it hallucinates
    verbosity: float = 1.0  # mean number of filler sentences per reply
    latency: LatencyProfile = field(default_factory=LatencyProfile)

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "SimProfile":
        """Parse a yaml `sim:` block; `accuracy` may give `default` for unlisted domains."""
        if not isinstance(d, dict) or not d:
            raise SimProfileError(f"{where}: missing or empty 'sim' block")
        known = {f.name for f in fields(cls)}
        if set(d) - known:
            raise SimProfileError(f"{where}: unknown sim key(s) {sorted(set(d) - known)}")
        acc_in = d.get("accuracy")
        if not isinstance(acc_in, dict):
            raise SimProfileError(f"{where}: sim.accuracy must be a mapping domain -> probability")
        if set(acc_in) - set(DOMAINS) - {"default"}:
            raise SimProfileError(f"{where}: sim.accuracy has unknown domain(s) "
                                  f"{sorted(set(acc_in) - set(DOMAINS) - {'default'})}; known: {list(DOMAINS)}")
        accuracy = {}
        for dom in DOMAINS:
            if dom not in acc_in and "default" not in acc_in:
                raise SimProfileError(f"{where}: sim.accuracy lacks {dom!r} and has no 'default'")
            accuracy[dom] = _prob(acc_in.get(dom, acc_in.get("default")), f"{where}: sim.accuracy.{dom}")
        lat_in = d.get("latency") or {}
        lat_known = {f.name for f in fields(LatencyProfile)}
        if not isinstance(lat_in, dict) or set(lat_in) - lat_known:
            raise SimProfileError(f"{where}: sim.latency must be a mapping with keys from {sorted(lat_known)}")
        lat = {k: _number(v, f"{where}: sim.latency.{k}", low=0.0) for k, v in lat_in.items()}
        if lat.get("tokens_per_s", 1.0) <= 0:
            raise SimProfileError(f"{where}: sim.latency.tokens_per_s must be > 0")
        return cls(
            accuracy=accuracy,
            multi_hop=_prob(d.get("multi_hop", cls.multi_hop), f"{where}: sim.multi_hop"),
            idk_rate=_prob(d.get("idk_rate", cls.idk_rate), f"{where}: sim.idk_rate"),
            verbosity=_number(d.get("verbosity", cls.verbosity), f"{where}: sim.verbosity", 0.0, len(FILLER)),
            latency=LatencyProfile(**lat),
        )


def _number(v, where: str, low: float = -math.inf, high: float = math.inf) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v <= high:
        raise SimProfileError(f"{where}: expected a number in [{low}, {high}], got {v!r}")
    return float(v)


def _prob(v, where: str) -> float:
    return _number(v, where, 0.0, 1.0)


class SimExpert:
    """One simulated model: reads a query against the world and answers in its own way."""

    def __init__(self, name: str, profile: SimProfile, world: SimWorld):
        self.name, self.profile, self.world = name, profile, world

    def _coin(self, *parts: object) -> float:
        return stable_unit(self.world.seed, self.name, *parts)

    def knows(self, fact: Fact) -> bool:
        """Deterministic in (world seed, model, fact); true for about accuracy[domain] of facts."""
        return self._coin("knows", fact.key) < self.profile.accuracy[fact.domain]

    def _admits(self, fact: Fact) -> bool:
        return self._coin("idk", fact.key) < self.profile.idk_rate

    def _wrong(self, fact: Fact) -> str:
        """A plausible wrong object: another entity of the right type, stable per fact."""
        pool = self.world.by_type[_rel(fact).obj]
        i = stable_int(self.world.seed, self.name, "wrong", fact.key) % (len(pool) - 1)
        return pool[i] if pool[i] != fact.object else pool[-1]

    def _filler(self, query: str) -> str:
        v = self.profile.verbosity
        n = int(v) + (self._coin("verbosity", query) < v - int(v))
        picks = random.Random(stable_int(self.world.seed, self.name, "filler", query)).sample(FILLER, min(n, len(FILLER)))
        return "".join(" " + s for s in picks)

    def reply(self, query: str) -> str:
        """The expert's full reply (before max_tokens) to one user message."""
        parsed = self.world.parse(query)
        if parsed is None:
            return CANT_TELL
        subject = parsed.entity.name
        if not parsed.relations:
            return (f"I know of {subject}, but I can't tell what you want to know about it. "
                    "Please ask about one fact.")
        if len(parsed.relations) == 1:
            text = self._one_hop(self.world.fact(parsed.relations[0].name, subject))
        else:
            f1 = self.world.fact(parsed.relations[0].name, subject)
            text = self._two_hop(f1, self.world.fact(parsed.relations[1].name, f1.object))
        return text + self._filler(query)

    def _one_hop(self, f: Fact) -> str:
        r = _rel(f)
        if self.knows(f):
            return f"{f.object}. {r.state(f.subject, f.object)}"
        if self._admits(f):
            return f"I don't know {r.phrase.format(s=f.subject)}."
        wrong = self._wrong(f)
        return f"{wrong}. {r.state(f.subject, wrong)}"

    def _two_hop(self, f1: Fact, f2: Fact) -> str:
        r1, r2 = _rel(f1), _rel(f2)
        if self.knows(f1):
            first = r1.state(f1.subject, f1.object)
            if self.knows(f2) and self._coin("chain", f1.key, f2.key) < self.profile.multi_hop:
                return f"{f2.object}. {first} {r2.state(f2.subject, f2.object)}"
            if self._admits(f2):  # a partial answer: still useful to a router that asks again
                return f"{first} But I don't know {r2.phrase.format(s=f2.subject)}."
            wrong = self._wrong(f2)
            return f"{wrong}. {first} {r2.state(f2.subject, wrong)}"
        outer = r1.phrase.format(s=f1.subject)
        if self._admits(f1):
            return f"I don't know {r2.phrase.format(s=outer)}."
        wrong = self._wrong(f2)
        return f"{wrong}. {r2.state(outer, wrong)}"


def _rel(f: Fact) -> Relation:
    return RELATIONS[f.relation]


def last_user_text(messages: list[dict]) -> str:
    """Content of the last user message (the last message if none is from the user)."""
    for m in reversed(messages):
        if m.get("role") == "user":
            return str(m.get("content") or "")
    return str(messages[-1].get("content") or "") if messages else ""


class SimBackend:
    """Pool back end of simulated experts, keyed by api id; sleeps a sampled latency per call."""

    def __init__(self, experts: dict[str, SimExpert], latency_scale: float = 1.0, seed: int = 0):
        if latency_scale < 0:
            raise ValueError(f"SimBackend: latency_scale must be >= 0, got {latency_scale}")
        self.experts = experts
        self.latency_scale = latency_scale
        self._rng = random.Random(stable_int("latency", seed))

    @classmethod
    def from_pool_yaml(cls, path: str | os.PathLike, seed: int = 0, latency_scale: float = 1.0,
                       world: SimWorld | None = None) -> "SimBackend":
        """Experts for every model of a pool yaml, each with its `sim:` profile, over SimWorld(seed)."""
        registry = ModelRegistry.from_yaml(path)
        world = world if world is not None else SimWorld(seed=seed)
        experts = {}
        for spec in registry.models.values():
            where = f"{path}: model {spec.name!r}"
            if spec.api_id in experts:
                raise SimProfileError(f"{where}: api_id {spec.api_id!r} used twice")
            experts[spec.api_id] = SimExpert(spec.name, SimProfile.from_dict(spec.sim, where), world)
        return cls(experts, latency_scale=latency_scale, seed=seed)

    @property
    def world(self) -> SimWorld:
        return next(iter(self.experts.values())).world

    def model_ids(self) -> list[str]:
        return list(self.experts)

    def respond(self, api_id: str, messages: list[dict], max_tokens: int) -> tuple[str, int, int]:
        """(text, prompt_tokens, completion_tokens) at once, without latency: for in-process use."""
        text, _ = truncate_tokens(self.experts[api_id].reply(last_user_text(messages)), max_tokens)
        prompt_tokens = sum(count_tokens(str(m.get("content") or "")) for m in messages)
        return text, prompt_tokens, count_tokens(text)

    async def complete(self, api_id: str, messages: list[dict], temperature: float, max_tokens: int,
                       seed: int | None) -> tuple[str, int, int]:
        """The Backend call: reply, then sleep the sampled latency times latency_scale."""
        text, prompt_tokens, completion_tokens = self.respond(api_id, messages, max_tokens)
        if self.latency_scale > 0:
            profile = self.experts[api_id].profile.latency
            await asyncio.sleep(self.latency_scale * profile.sample(self._rng, completion_tokens))
        return text, prompt_tokens, completion_tokens
