"""The annotator: each hop of a simulated question goes to the cheapest model that knows its domain.

The reply is the REAL simulated reply (the pool's experts, same world seed), wrapped exactly as the rollout wraps
it; the second hop asks about the entity the first reply gave, right or wrong. With probability `noise` (the
builder's) a trajectory is a slip instead: an expensive generalist, a cheap non-specialist, a guess, or the whole
question at once, so RL has something to improve. `Habits` adds two systematic ones: the cautious annotator
(`prefer_big`: everything to the strongest, dearest generalist, a habit a cost-aware reward has to undo) and the
mix-up (`confuse`: a hop of a `confuse_domains` domain goes to the cheap model weakest on it, so the supervised
policy's greedy choice there is wrong and RL, which samples the right one too, can undo it).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from data_process.schema import DataBuildError
from router_r1.actions import format_observation, render_route
from router_r1.pool.registry import ModelRegistry, ModelSpec
from router_r1.pool.messages import submodel_messages
from sim.backend import SimBackend
from sim.embedded import priced_name
from sim.warm_start.pool_variation import Listing
from sim.world import DOMAINS, RELATIONS, SimQuestion, SimWorld

RELIABLE = 0.9  # a model is the specialist of a domain from this accuracy on
NOISE_MODES = ("generalist", "cheap_other", "guess", "whole")
BIG = "big"  # the cautious annotator's mode: everything to the strongest generalist
NO_ANSWER = "unknown"
FALLBACKS = ("best", "listed")  # Fallback.fallback
# Replies that carry no answer up front (see sim/backend.py: "I don't know ...", CANT_TELL, ...).
_NO_ANSWER_MARKS = ("i don't know", "i'm sorry", "i know of")
_UNBOUNDED = 10**9  # the oracle never cuts a reply; the rollout's max_obs_length must be above the longest


@dataclass
class Habits:
    """The annotator's systematic slips: the cautious annotator and the domain mix-up."""

    prefer_big: float = 0.0  # P(the annotator sends the question to the strongest generalist: hop by hop for one hop, whole for two)
    confuse: float = 0.0  # P(an oracle-mode hop of a --confuse-domains domain goes to the cheap model weakest on it: the annotator's systematic mix-up)
    confuse_domains: list[str] = field(default_factory=lambda: ["people", "science"])  # the domains the annotator mixes up (comma-separated works too)

    def __post_init__(self):
        for flag, share in (("--prefer-big", self.prefer_big), ("--confuse", self.confuse)):
            if not 0.0 <= share <= 1.0:
                raise ValueError(f"{flag} must be in [0, 1], got {share}")
        self.confuse_domains = [d for item in self.confuse_domains for d in item.split(",") if d]
        for d in self.confuse_domains:
            if d not in DOMAINS:
                raise ValueError(f"confuse domain {d!r} is not one of {list(DOMAINS)}")

    def check(self, recipe) -> None:
        """The other route sources (per-alpha routes, turn budgets) plan their own routes: no habits there."""
        if (self.prefer_big or self.confuse) and not recipe.hop_routes:
            raise ValueError("--prefer-big and --confuse are habits of the hop-by-hop oracle: drop them with "
                             "--alphas, --budgets or --routes uniform")

    @property
    def mixed_up(self) -> tuple[str, ...]:
        """The domains the Oracle mixes up (none when `confuse` is off)."""
        return tuple(self.confuse_domains) if self.confuse > 0 else ()


@dataclass
class Trajectory:
    segments: list[dict] = field(default_factory=list)  # {text, by_policy}
    routes: list[tuple[str, str]] = field(default_factory=list)  # (model, query)
    answer: str = NO_ANSWER
    cost_usd: float = 0.0
    confused: bool = False  # a hop went to the mistaken expert (the confuse slip)

    def say(self, text: str) -> None:
        self.segments.append({"text": text, "by_policy": True})

    @property
    def text(self) -> str:
        return "".join(s["text"] for s in self.segments)


def stated_candidates(listing: Listing, domain: str) -> str:
    """The think's restatement of `domain`'s candidates, in listing order: "Listed for science: Qwen2.5-7B-Instruct
    $0.30, Keta-70B $0.20." (the generalists' lines, "None listed for arts; all topics: ...", when no line names it)."""
    lines = listing.naming(domain)
    head = f"Listed for {domain}" if any(domain in ln.topics for ln in lines) else f"None listed for {domain}; all topics"
    return f"{head}: {', '.join(priced_name(ln.spec) for ln in lines)}."


def reply_answer(reply: str) -> str | None:
    """The answer an expert put first ("Sazom. The ... is Sazom."), or None if it gave none."""
    low = reply.lower()
    if any(m in low for m in _NO_ANSWER_MARKS) or not reply.strip():
        return None
    head = reply.split(". ", 1)[0].strip().rstrip(".").strip()
    return head or None


def ask(backend: SimBackend, traj: Trajectory, think: str, spec: ModelSpec, query: str) -> str | None:
    """One turn that routes: think + route by the policy, then the real reply as an observation; the answer it
    gives, if any."""
    traj.say(f"<think>{think}</think>{render_route(spec.name, query)}")
    text, pt, ct = backend.respond(spec.api_id, submodel_messages(query), spec.max_tokens)
    traj.segments.append({"text": format_observation(text, _UNBOUNDED), "by_policy": False})
    traj.routes.append((spec.name, query))
    traj.cost_usd += spec.output_cost(ct)  # the reward's default cost (env.cost_basis output)
    return reply_answer(text)


def finish(traj: Trajectory, got: str | None) -> Trajectory:
    """The last turn: the answer found, else NO_ANSWER."""
    traj.answer = got if got is not None else NO_ANSWER
    think = "Answer found." if got is not None else "No answer found."
    traj.say(f"<think>{think}</think><answer>{traj.answer}</answer>")
    return traj


def pick_mode(q: SimQuestion, noise: float, rng: random.Random, prefer_big: float = 0.0) -> str:
    """"oracle", BIG with probability prefer_big, else a NOISE_MODES slip with probability noise."""
    if prefer_big > 0 and rng.random() < prefer_big:  # no draw when off: old seeds give old data
        return BIG
    if rng.random() >= noise:
        return "oracle"
    modes = [m for m in NOISE_MODES if m != "whole" or len(q.hops) > 1]
    return rng.choice(modes)


class Oracle:
    """Routes hops to the cheapest reliable model, with the noise modes of NOISE_MODES."""

    def __init__(self, backend: SimBackend, registry: ModelRegistry, max_routes: int = 3,
                 confuse: float = 0.0, confuse_domains: tuple[str, ...] = (),
                 specialist: dict[str, ModelSpec] | None = None, listing: Listing | None = None,
                 fallback: str = "best"):
        """`specialist`: the model each domain's hops go to (a varied listing's choice); default the cheapest
        model reliable on it. `listing`: the row's listing, whose candidates an oracle-mode hop's think states.
        `fallback`: Fallback.fallback ("listed" needs the listing)."""
        self.backend, self.registry, self.max_routes = backend, registry, max_routes
        self.listing = listing
        if fallback not in FALLBACKS or (fallback == "listed" and listing is None):
            raise ValueError(f"fallback must be one of {FALLBACKS} (listed with a listing), got {fallback!r}")
        self.fallback = fallback
        self.confuse = confuse
        self.world: SimWorld = backend.world
        self.models = list(registry.models.values())
        for spec in self.models:
            if spec.api_id not in backend.experts:
                raise DataBuildError(f"{registry.source}: model {spec.name!r} (api_id {spec.api_id!r}) "
                                     "has no simulated expert")
        self.acc = {s.name: backend.experts[s.api_id].profile.accuracy for s in self.models}
        self.specialist = {}
        for d in DOMAINS:
            reliable = [s for s in self.models if self.acc[s.name][d] >= RELIABLE]
            if not reliable:
                raise DataBuildError(f"{registry.source}: no model is reliable (>= {RELIABLE}) on {d!r}")
            self.specialist[d] = min(reliable, key=lambda s: s.price_out_per_m)
        self.specialist.update(specialist or {})
        self.generalists = [s for s in self.models if min(self.acc[s.name].values()) >= 0.75]
        if not self.generalists:
            raise DataBuildError(f"{registry.source}: no generalist model (accuracy >= 0.75 on every domain)")
        self.strongest = max(self.generalists, key=lambda s: (min(self.acc[s.name].values()), s.price_out_per_m))
        # The annotator's mix-up: for each confused domain, the cheap model that knows it least.
        self.mistaken = {}
        for d in confuse_domains:
            if d not in DOMAINS:
                raise ValueError(f"confuse domain {d!r} is not one of {list(DOMAINS)}")
            cheap = [s for s in self.models if s not in self.generalists and s is not self.specialist[d]]
            if not cheap:
                raise DataBuildError(f"{registry.source}: no cheap non-specialist model to confuse {d!r} with")
            self.mistaken[d] = min(cheap, key=lambda s: (self.acc[s.name][d], s.price_out_per_m))

    def best(self, domain: str, exclude: set[str]) -> ModelSpec | None:
        left = [s for s in self.models if s.name not in exclude]
        return max(left, key=lambda s: (self.acc[s.name][domain], -s.price_out_per_m)) if left else None

    def ask(self, traj: Trajectory, think: str, spec: ModelSpec, query: str) -> str | None:
        return ask(self.backend, traj, think, spec, query)

    def ask_hop(self, traj: Trajectory, think: str, spec: ModelSpec, query: str, domain: str,
                whole: bool = False) -> str | None:
        """Ask, and once ask another model if the reply holds no answer (`retry`)."""
        got = self.ask(traj, think, spec, query)
        if got is None and len(traj.routes) < self.max_routes:
            other, think = self.retry(domain, spec, whole)
            got = self.ask(traj, think, other, query)
        return got

    def retry(self, domain: str, failed: ModelSpec, whole: bool = False) -> tuple[ModelSpec, str]:
        """Who is asked after `failed` gave no answer on a `domain` hop, and the think that says so. A whole
        question goes to the most reliable model either way: no specialist chains two facts."""
        if self.fallback == "listed" and not whole:
            left = [ln for ln in self.listing.lines if domain in ln.topics and ln.spec.name != failed.name]
            if left:
                pick = min(left, key=lambda ln: ln.spec.price_out_per_m).spec  # the first listed of equal prices
                stated = ", ".join(priced_name(ln.spec) for ln in left)
                return pick, f"No answer. Next listed for {domain}: {stated}. Ask {pick.name}."
        # another backend: a listing may show one profile under two names, and it would answer the same
        other = self.best(domain, {s.name for s in self.models if s.api_id == failed.api_id})
        return other, f"No answer. Ask {other.name}."

    def run(self, q: SimQuestion, mode: str, rng: random.Random) -> Trajectory:
        """One trajectory for `q`; mode is "oracle", BIG or one of NOISE_MODES."""
        traj = Trajectory()
        if mode == "guess":
            pool = self.world.by_type[RELATIONS[q.hops[-1].relation].obj]
            traj.answer = rng.choice(pool)
            traj.say(f"<think>I will guess.</think><answer>{traj.answer}</answer>")
            return traj
        if mode == "whole" or (mode == BIG and len(q.hops) > 1):
            spec = self.strongest if mode == BIG else rng.choice(self.models)
            got = self.ask_hop(traj, f"Ask {spec.name} the whole question.", spec, q.question, q.hops[-1].domain,
                               whole=True)
            return self._finish(traj, got)
        generalist = rng.choice(self.generalists)
        odd_hop = rng.randrange(len(q.hops))
        got = None
        for i, hop in enumerate(q.hops):
            spec, slip = self.specialist[hop.domain], mode != "oracle"
            if mode == "generalist":
                spec = generalist
            elif mode == BIG:
                spec = self.strongest
            elif mode == "cheap_other" and i == odd_hop:
                cheap = [s for s in self.models if s not in self.generalists and s is not spec]
                spec = rng.choice(cheap) if cheap else spec
            elif mode == "oracle" and hop.domain in self.mistaken and rng.random() < self.confuse:
                spec, traj.confused, slip = self.mistaken[hop.domain], True, True  # no draw unless the domain is confused
            query, think = hop.sub_question, f"A {hop.domain} fact. Ask {spec.name}."
            if self.listing is not None and not slip:
                # Slips (noise modes, the confused hop) keep the short think: a stated list is always followed by
                # its cheapest line, so the copy the policy learns has no exceptions.
                if spec.name != self.listing.choice(hop.domain).name:
                    raise DataBuildError(f"the oracle's pick {spec.name!r} for {hop.domain!r} is not the cheapest "
                                         f"listed line naming it: {self.listing.text!r}")
                think = f"A {hop.domain} fact. {stated_candidates(self.listing, hop.domain)} Ask {spec.name}."
            if i > 0:
                query = hop.sub_question.replace(hop.subject, got)  # follow the first reply, right or wrong
                think = f"Got {got}. " + think
            got = self.ask_hop(traj, think, spec, query, hop.domain)
            if got is None:  # no entity to continue with
                break
        return self._finish(traj, got)

    def _finish(self, traj: Trajectory, got: str | None) -> Trajectory:
        return finish(traj, got)
