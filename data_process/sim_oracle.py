"""Noisy oracle trajectories on the simulated world: the supervised warm start of the embedded router.

    python -m data_process.sim_oracle --out-dir data/embedded --n 2000 --noise 0.3 --prefer-big 0.5 --report

For each hop the oracle thinks briefly and routes the hop's sub-question to the cheapest
model that is reliable on the hop's domain; the reply is the REAL simulated reply (the
server's experts, same world seed) wrapped exactly as the rollout wraps it. The second
hop asks about the entity the first reply gave, right or wrong. With probability
`noise` a trajectory is suboptimal (an expensive generalist, a cheap non-specialist, a
guess, or the whole question at once), so RL has something to improve. With probability
`prefer_big` the annotator is cautious instead: it sends the question to the strongest
(and most expensive) generalist, hop by hop for one hop and whole for two; that model is
right about as often as the cheap specialists but costs several times more, so a
cost-aware reward (alpha > 0) has a habit of the warm start to undo. With probability
`confuse` a hop of a `confuse_domains` domain goes, in the oracle mode, to the cheap expert
the annotator wrongly takes for that domain's specialist (the cheap model weakest on it):
a systematic slip, so the supervised policy's greedy choice for that domain is the wrong
expert, and RL, which samples the right one too and is paid for it, can undo it.
With `rename` a share of trajectories have their entities renamed to others of the world
(sim/name_swap.py), and `whole_names` keeps each multi-word name one token: together
they teach the small policy to copy any name (docs/results/router_quality). With `vary_pool` a share of
rows list their own pool (sim/pool_variation.py: random subsets, orders, names and prices) and route
to the cheapest listed model naming the hop's domain, so the policy reads the listing instead of memorising
it, and a model it never saw can be picked from its line (docs/results/unseen_model). With `add_rival` a share
of rows list the pool's own models plus one made-up rival line, so the familiar listing obeys that rule too.
With `think_candidates` each oracle-mode hop's <think> restates the listed candidates for its domain with their
prices before the pick, so the pick is a copy of the cheapest from a few tokens back, not a lookup across the
prompt (as restating the cost weight made the alpha take: docs/results/h200/gemma_alpha). With `fallback`
"listed" a hop whose reply holds no answer is asked next of the cheapest other listed line naming its domain (the
think states those lines), not of the most reliable model, and each made-up line is a model of its own (a twin of
its profile: the same skills, its own coins); `fallback_drill` gives a share of rows a cheaper rival line that has
no answer for the first hop, so that fallback is shown often enough to be learned
(docs/results/h200/gemma_unseen/fallback). With `misname_drill` a share of rows first route under a misspelt name
("SiliGLM-6B" for SciGLM-6B, the slip the 270M router makes on a new name), get the hint the environment gives with
env.invalid_hint, and route again under the listed name; the slip is kept as context but not learnt (loss false).

Writes OUT/oracle.parquet (prompt, response_text, segments, answers, ...), the prompt
template it used (OUT/prompt_template.txt: give it to sim_qa so RL sees the same
prompts), and unless --no-tokenizer the BPE tokenizer (OUT/tokenizer) and the policy
config (OUT/model.json) of the embedded default.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from data_process.build_qa import REPO_ROOT, make_prompter, size_arg
from sim.name_swap import EntityNames
from sim.name_swap import apply as apply_names
from sim.pool_variation import BANK_SIZE, RIVAL_CHEAPER, Listing, PoolVariation, canonical_listing, name_bank
from data_process.schema import DataBuildError
from router_r1.pool.registry import ModelRegistry, ModelSpec, RegistryError
from sim.backend import SimBackend, SimExpert, last_user_text
from sim.world import DEFAULT_ENTITIES, DOMAINS, RELATIONS, SimQuestion, SimWorld
from sim.embedded import COMPACT_TEMPLATE, priced_name, world_words
from router_r1.prompts import TemplateError, build_router_prompt, fill_template, load_template, submodel_messages
from router_r1.actions import Action, format_observation, invalid_observation, render_route
from router_r1.reward.format import check_format
from router_r1.reward.qa_em import em_score

DEFAULT_POOL = REPO_ROOT / "configs" / "pool" / "sim.yaml"
RELIABLE = 0.9  # a model is the specialist of a domain from this accuracy on
NOISE_MODES = ("generalist", "cheap_other", "guess", "whole")
BIG = "big"  # the cautious annotator's mode: everything to the strongest generalist
NO_ANSWER = "unknown"
FALLBACKS = ("best", "listed")  # OracleConfig.fallback
DRILL = "drill"  # the mode of a fallback_drill row
# Replies that carry no answer up front (see sim/backend.py: "I don't know ...", CANT_TELL, ...).
_NO_ANSWER_MARKS = ("i don't know", "i'm sorry", "i know of")
_UNBOUNDED = 10**9  # the oracle never cuts a reply; the rollout's max_obs_length must be above the longest


@dataclass
class OracleConfig:
    out_dir: str | Path
    n: int = 2000
    noise: float = 0.3
    prefer_big: float = 0.0  # P(the annotator sends the question to the strongest generalist)
    confuse: float = 0.0  # P(an oracle-mode hop of a confuse_domains domain goes to the mistaken expert)
    confuse_domains: tuple[str, ...] = ("people", "science")
    seed: int = 0  # question draw and noise
    world_seed: int = 0  # must equal the simulated pool's seed
    world_entities: int = DEFAULT_ENTITIES  # entities per type; must equal the pool's --world-entities
    pool: str | Path = DEFAULT_POOL
    prompt_template: str | Path | None = None  # None: the compact template with the compact pool text
    two_hop_frac: float = 0.4
    max_routes: int = 3
    report: bool = False
    tokenizer: bool = True
    vocab_size: int = 1024
    # The world's names as whole tokens (one-step copies), or left to the BPE (syllables: every piece is
    # seen in training, so a name the SFT data never showed can still be copied piece by piece)
    name_tokens: bool = True
    # Each multi-word entity name ("Dekir Takem", "Nohi Holdings") one token too: a copy is one step, not
    # name, space, name in the right order (needs name_tokens)
    whole_names: bool = False
    model: str | None = None  # JSON of EMBEDDED_MODEL keys to override in OUT/model.json ({"hidden_size": 256})
    # Hold the names' embedding rows at their random start (model.config.frozen_token_ids): the policy
    # learns to copy names in general, also those the SFT data never showed (about 1 test question in 5)
    freeze_names: bool = False
    # Share of trajectories whose names are renamed, consistently, to other names of the world
    # (sim/name_swap.py): the copies then cover the whole world, not only the train questions' entities
    rename: float = 0.0
    # Share of rows whose prompt lists a pool of its own (pool_variation.PoolVariation), its names from a bank
    # (whole tokens), routed to the cheapest listed model naming the domain
    vary_pool: float = 0.0
    # Share of rows whose prompt lists the pool's own models plus one made-up model (PoolVariation.with_rival),
    # cheaper than the pick for its domains RIVAL_CHEAPER of the time, routed to the cheapest listed model naming
    # the domain: the familiar listing is then a case of that rule too (vary_pool + add_rival <= 1)
    add_rival: float = 0.0
    # Each oracle-mode hop's <think> states the row's listed lines naming the hop's domain, with their prices
    # (the pool's own listing for rows without one), then picks the cheapest: the alpha only took once each
    # decision restated it (docs/results/h200/gemma_alpha), and the unseen line was never picked without this
    think_candidates: bool = False
    # Made-up model names the varied and rival lines draw from: a few dozen are learnt by heart; with many, each seen
    # a few times, the router must copy a listed name it does not know, as it must the unseen model's
    bank_size: int = BANK_SIZE
    # The bank's names in the shapes real model names take ("Kavo2.5-7B-Instruct", "KAVO-7B", "KavoLM-7B", ...),
    # not "Kavo-7B" only: a new model's name (SciGLM-6B) is then not the one shape no row shows
    bank_styles: bool = False
    # P(a rival line undercuts the listing's pick for its domains); at 0.7 "ask the made-up name" is right in most
    # two-line decisions without reading a price (docs/results/h200/gemma_unseen/fallback); the drill's are cheaper
    rival_cheaper: float = RIVAL_CHEAPER
    # After a reply without an answer, who is asked: "best", the most reliable other model (Mixtral-8x22B on every
    # seen domain, whatever it costs); "listed", the cheapest other listed line naming the hop's domain, the think
    # stating those lines, else "best". "listed" needs think_candidates, and makes each made-up line its own model.
    fallback: str = "best"
    # Share of oracle-mode rows that list the pool's own models plus a cheaper rival line for the first hop's domain
    # whose reply to that hop has no answer (fallback "listed"): the fallback to the next listed line, about one
    # row in 200 otherwise, shown often enough to be learned; the rows' questions are those drawn without it
    fallback_drill: float = 0.0
    # Share of oracle-mode rows (with think_candidates, fewer than max_routes routes) whose first route misspells the
    # name its think picked, one letter changed, dropped, doubled or swapped (never another model's name), followed by
    # the invalid-action hint (env.invalid_hint: the pool's names) and the same route under the listed name. The slip
    # turn is context (loss false), so only the recovery is learnt; evaluate such a router with --invalid-hint.
    misname_drill: float = 0.0


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


def twin_expert(backend: SimBackend, api_id: str, name: str) -> SimExpert:
    """The simulated model a line named `name` of profile `api_id` answers as: the profile's skills, its own coins."""
    base = backend.experts[api_id.split("~")[0]]
    return SimExpert(name, base.profile, base.world)


def twin(backend: SimBackend, spec: ModelSpec) -> ModelSpec:
    """`spec` answered by a model of its own (`twin_expert`, registered with the backend as api_id
    "<profile api_id>~<name>"), so two listed lines of one profile need not miss together."""
    api_id = f"{spec.api_id.split('~')[0]}~{spec.name}"
    if api_id not in backend.experts:
        backend.experts[api_id] = twin_expert(backend, spec.api_id, spec.name)
    return replace(spec, api_id=api_id)


def twinned(listing: Listing, backend: SimBackend) -> Listing:
    """`listing` with each made-up line (a name other than its profile's) a twin of its profile."""
    return Listing(tuple(ln if ln.spec.name == ln.profile else replace(ln, spec=twin(backend, ln.spec))
                         for ln in listing.lines))


def reply_answer(reply: str) -> str | None:
    """The answer an expert put first ("Sazom. The ... is Sazom."), or None if it gave none."""
    low = reply.lower()
    if any(m in low for m in _NO_ANSWER_MARKS) or not reply.strip():
        return None
    head = reply.split(". ", 1)[0].strip().rstrip(".").strip()
    return head or None


class Oracle:
    """Routes hops to the cheapest reliable model, with the noise modes of NOISE_MODES."""

    def __init__(self, backend: SimBackend, registry: ModelRegistry, max_routes: int = 3,
                 confuse: float = 0.0, confuse_domains: tuple[str, ...] = (),
                 specialist: dict[str, ModelSpec] | None = None, listing: Listing | None = None,
                 fallback: str = "best"):
        """`specialist`: the model each domain's hops go to (a varied listing's choice); default the cheapest
        model reliable on it. `listing`: the row's listing, whose candidates an oracle-mode hop's think states.
        `fallback`: OracleConfig.fallback ("listed" needs the listing)."""
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
        """One turn that routes: think + route by the policy, then the real reply as an observation."""
        traj.say(f"<think>{think}</think>{render_route(spec.name, query)}")
        text, pt, ct = self.backend.respond(spec.api_id, submodel_messages(query), spec.max_tokens)
        traj.segments.append({"text": format_observation(text, _UNBOUNDED), "by_policy": False})
        traj.routes.append((spec.name, query))
        traj.cost_usd += spec.cost(pt, ct)
        return reply_answer(text)

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
        """One trajectory for `q`; mode is "oracle" or one of NOISE_MODES."""
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
        traj.answer = got if got is not None else NO_ANSWER
        think = "Answer found." if got is not None else "No answer found."
        traj.say(f"<think>{think}</think><answer>{traj.answer}</answer>")
        return traj


class Renamer:
    """--rename: a share of rows get their entities renamed to other names of the world (name_swap, drawn
    deck-wise over all rows), one mapping per row across its question, segments, answers and answer."""

    def __init__(self, world: SimWorld, template_path: str | Path, share: float, seed: int):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"--rename must be in [0, 1], got {share}")
        self.share = share
        # its own stream, so the questions and the noise of a seed do not depend on --rename
        self.rng = random.Random(f"rename-{seed}")
        # the template's words (model names, tags) are never renamed
        self.names = EntityNames.from_world(world, reserved=set(re.findall(r"\w+", Path(template_path).read_text())))
        self.decks: dict[str, list[str]] = {}  # the renaming's draws, shared by all rows (EntityNames.mapping)

    def __call__(self, question: str, segments: list[dict], answers: list[str], answer: str):
        """(renamed, question, segments, answers, answer): renamed for a share of rows, else as given."""
        if not self.rng.random() < self.share:
            return False, question, segments, answers, answer
        text = "".join(seg["text"] for seg in segments)
        names = self.names.mapping([question, text, *answers], self.rng, self.decks)
        segments = [{**seg, "text": apply_names(names, seg["text"])} for seg in segments]
        return True, apply_names(names, question), segments, [apply_names(names, a) for a in answers], \
            apply_names(names, answer)


def misspell(name: str, registry: ModelRegistry, rng: random.Random) -> str:
    """`name` with one letter of its first word changed, dropped, doubled or swapped with the next, so that it
    resolves to no model of `registry` (its names compare without case, spaces and hyphens)."""
    stem = re.match(r"[A-Za-z]+", name)
    letters = stem.end() if stem else 0
    if letters < 2:
        raise ValueError(f"misspell: {name!r} does not start with two letters")
    for _ in range(100):
        i, edit = rng.randrange(letters), rng.choice(("change", "drop", "double", "swap"))
        c = name[i]
        if edit == "change":
            other = rng.choice([x for x in "aeioulnrstmk" if x != c.lower()])
            wrong = name[:i] + (other.upper() if c.isupper() else other) + name[i + 1:]
        elif edit == "drop":
            wrong = name[:i] + name[i + 1:]
        elif edit == "double":
            wrong = name[:i + 1] + name[i:]
        else:
            a = min(i, letters - 2)  # the letter and the next; the last letter swaps with the one before
            b = a + 1
            wrong = name[:a] + name[b] + name[a] + name[b + 1:]
        if registry.resolve(wrong) is None:
            return wrong
    raise ValueError(f"misspell: every edit of {name!r} names a model of {registry.source}")


def misname_first_route(traj: Trajectory, registry: ModelRegistry, rng: random.Random) -> str | None:
    """--misname-drill: the first route turn becomes a misspelt route (kept as context, loss false), the
    environment's invalid-action hint, and the route again under the listed name. Returns the misspelt name, or
    None if the trajectory does not open with a route."""
    first = traj.segments[0]["text"] if traj.segments else ""
    if not traj.routes or "</think><search>" not in first:
        return None
    name, query = traj.routes[0]
    wrong = misspell(name, registry, rng)
    think = first[: first.index("</think>") + len("</think>")]
    hint = invalid_observation(Action("invalid", model=wrong, query=query, reason="unknown_model"), hint=True,
                               names=registry.names)
    traj.segments[:1] = [
        {"text": think + render_route(wrong, query), "by_policy": True, "loss": False},
        {"text": hint, "by_policy": False},
        {"text": f"<think>{wrong} is not listed. Ask {name}.</think>{render_route(name, query)}", "by_policy": True},
    ]
    return wrong


def drill_listing(variation: PoolVariation, canonical: Listing, backend: SimBackend, q: SimQuestion,
                  rng: random.Random) -> Listing | None:
    """The pool's own listing plus a cheaper rival line for `q`'s first hop domain whose twin has no answer to that
    hop (--fallback-drill); None if no bank name's twin lacks one."""
    hop = q.hops[0]
    query = last_user_text(submodel_messages(hop.sub_question))  # as the backend reads the oracle's ask

    def fails(name: str, spec: ModelSpec) -> bool:
        return reply_answer(twin_expert(backend, spec.api_id, name).reply(query)) is None
    return variation.drill_rival(canonical, rng, hop.domain, fails)


def varied_pools(cfg: OracleConfig, registry: ModelRegistry, world: SimWorld) -> PoolVariation:
    """The --vary-pool listings over the seen models, their names from a bank clear of the pool's, the world's
    and the template's words."""
    reserved = set(ModelRegistry.from_yaml(cfg.pool).names) | set(world_words(world)) | \
        set(re.findall(r"\w+", COMPACT_TEMPLATE.read_text()))
    bank = name_bank(cfg.bank_size, reserved=reserved, seed=cfg.world_seed, styled=cfg.bank_styles)
    return PoolVariation(registry, bank, cfg.rival_cheaper)


def model_names(cfg: OracleConfig, world: SimWorld) -> list[str]:
    """Every model name a prompt may list: the pool's (the unseen ones too) and, with --vary-pool or --add-rival,
    the bank's."""
    names = ModelRegistry.from_yaml(cfg.pool).names
    if cfg.vary_pool > 0 or cfg.add_rival > 0:
        names = names + varied_pools(cfg, ModelRegistry.from_yaml(cfg.pool).seen(), world).bank
    return names


def token_names(pool: str | Path, world: SimWorld, name_tokens: bool = True, whole_names: bool = False,
                models: list[str] | None = None) -> list[str]:
    """Words the tokenizer keeps whole: the model names (`models`, default the pool's), the world's names
    (name_tokens) and each multi-word entity name (whole_names: a copy is one step, not name, space, name in
    the right order)."""
    from sim.embedded import world_words

    if whole_names and not name_tokens:
        raise ValueError("--whole-names needs the names as whole tokens (drop --no-name-tokens)")
    models = ModelRegistry.from_yaml(pool).names if models is None else models
    names = list(models) + (world_words(world) if name_tokens else [])
    if whole_names:
        names += sorted(n for n in world.entities if " " in n)
    return names


def own_template(out: Path, prompt_template: str | Path | None, pool: str | Path) -> Path:
    """OUT/prompt_template.txt: a copy of `prompt_template`, or the compact template over the pool's seen models."""
    from sim.embedded import render_compact_template

    template = out / "prompt_template.txt"
    if prompt_template:
        if Path(prompt_template).resolve() != template.resolve():
            template.write_text(Path(prompt_template).read_text())
    else:
        template.write_text(render_compact_template(ModelRegistry.from_yaml(pool).seen()))
    return template


def pick_mode(q: SimQuestion, noise: float, rng: random.Random, prefer_big: float = 0.0) -> str:
    """"oracle", BIG with probability prefer_big, else a NOISE_MODES slip with probability noise."""
    if prefer_big > 0 and rng.random() < prefer_big:  # no draw when off: old seeds give old data
        return BIG
    if rng.random() >= noise:
        return "oracle"
    modes = [m for m in NOISE_MODES if m != "whole" or len(q.hops) > 1]
    return rng.choice(modes)


def build_rows(cfg: OracleConfig, template_path: str | Path) -> tuple[list[dict], list[str]]:
    """Oracle rows, and extra tokenizer text (every model's reply to a sample of sub-questions)."""
    if not 0.0 <= cfg.noise <= 1.0:
        raise ValueError(f"--noise must be in [0, 1], got {cfg.noise}")
    if not 0.0 <= cfg.prefer_big <= 1.0:
        raise ValueError(f"--prefer-big must be in [0, 1], got {cfg.prefer_big}")
    if not 0.0 <= cfg.confuse <= 1.0:
        raise ValueError(f"--confuse must be in [0, 1], got {cfg.confuse}")
    if cfg.max_routes < 2:
        raise ValueError(f"--max-routes must be >= 2 (two hops), got {cfg.max_routes}")
    if not 0.0 <= cfg.vary_pool <= 1.0:
        raise ValueError(f"--vary-pool must be in [0, 1], got {cfg.vary_pool}")
    if cfg.add_rival < 0.0 or cfg.vary_pool + cfg.add_rival > 1.0:
        raise ValueError(f"--add-rival must be >= 0 with --vary-pool + --add-rival <= 1, got {cfg.add_rival} "
                         f"(--vary-pool {cfg.vary_pool})")
    if cfg.fallback not in FALLBACKS:
        raise ValueError(f"--fallback must be one of {', '.join(FALLBACKS)}, got {cfg.fallback!r}")
    if cfg.fallback == "listed" and not cfg.think_candidates:
        raise ValueError("--fallback listed states the lines left in the think: add --think-candidates")
    if not 0.0 <= cfg.fallback_drill <= 1.0 or (cfg.fallback_drill > 0 and cfg.fallback != "listed"):
        raise ValueError(f"--fallback-drill must be in [0, 1], and > 0 only with --fallback listed, got "
                         f"{cfg.fallback_drill} (--fallback {cfg.fallback})")
    if not 0.0 <= cfg.misname_drill <= 1.0 or (cfg.misname_drill > 0 and not cfg.think_candidates):
        raise ValueError(f"--misname-drill must be in [0, 1], and > 0 only with --think-candidates (the think names "
                         f"the pick the slip misspells), got {cfg.misname_drill}")
    for flag, share in (("--vary-pool", cfg.vary_pool), ("--add-rival", cfg.add_rival)):
        if share > 0 and cfg.prompt_template:
            raise ValueError(f"{flag} lists each row's own pool in the compact template: drop --prompt-template")
    registry = ModelRegistry.from_yaml(cfg.pool).seen()
    canonical = canonical_listing(registry)  # the plain rows' listing; a rival row's, plus one line
    if cfg.think_candidates:  # the plain rows' thinks restate their prompt's lines: the template must show them
        shown = Path(template_path).read_text()
        missing = [priced_name(ln.spec) for ln in canonical.lines if priced_name(ln.spec) not in shown]
        if missing:
            raise ValueError(f"--think-candidates: {template_path} does not list {', '.join(missing)} as the "
                             "compact listing shows them: drop --prompt-template")
    world = SimWorld(seed=cfg.world_seed, n_entities_per_type=cfg.world_entities)
    backend = SimBackend.from_pool_yaml(cfg.pool, seed=cfg.world_seed, latency_scale=0.0, world=world)
    oracle = Oracle(backend, registry, cfg.max_routes, cfg.confuse, cfg.confuse_domains if cfg.confuse > 0 else (),
                    listing=canonical if cfg.think_candidates else None, fallback=cfg.fallback)
    prompter = make_prompter(cfg.pool, False, template_path, None)  # the builder sim_qa uses
    questions = backend.world.questions(cfg.n, cfg.seed, "train", cfg.two_hop_frac)
    rng = random.Random(cfg.seed)
    renamer = Renamer(world, template_path, cfg.rename, cfg.seed)
    variation = varied_pools(cfg, registry, world) if cfg.vary_pool + cfg.add_rival + cfg.fallback_drill > 0 else None
    vary_rng = random.Random(f"vary-pool-{cfg.seed}")  # its own stream: questions and noise as without
    drill_rng = random.Random(f"fallback-drill-{cfg.seed}")  # and the drill's
    misname_rng = random.Random(f"misname-drill-{cfg.seed}")
    compact = load_template(COMPACT_TEMPLATE)
    rows, counts = [], {}
    for q in questions:
        source = "sim_1hop" if len(q.hops) == 1 else "sim_2hop"
        index = counts[source] = counts.get(source, -1) + 1
        mode = pick_mode(q, cfg.noise, rng, cfg.prefer_big)
        listing, row_oracle, row_registry = None, oracle, registry
        u = vary_rng.random() if variation is not None else 1.0  # one draw a row: old seeds give old data
        if u < cfg.vary_pool:
            listing = variation.draw(vary_rng)
        elif u < cfg.vary_pool + cfg.add_rival:
            listing = variation.with_rival(canonical, vary_rng)
        drilled = None
        if cfg.fallback_drill > 0 and drill_rng.random() < cfg.fallback_drill and mode == "oracle":
            drilled = drill_listing(variation, canonical, backend, q, drill_rng)
            listing = drilled or listing
        if listing is not None:
            if cfg.fallback == "listed":
                listing = twinned(listing, backend)
            row_registry = listing.registry
            row_oracle = Oracle(backend, row_registry, cfg.max_routes, specialist=listing.choices(),
                                listing=listing if cfg.think_candidates else None, fallback=cfg.fallback)
        traj = row_oracle.run(q, mode, rng)
        ok, why = check_format(traj.text, row_registry)
        if not ok:  # a bug in the oracle, never in the data
            raise DataBuildError(f"oracle trajectory for {q.uid} breaks the format ({why}): {traj.text!r}")
        misnamed = None
        if cfg.misname_drill > 0 and misname_rng.random() < cfg.misname_drill and mode == "oracle" \
                and len(traj.routes) < cfg.max_routes:  # the slip takes a turn: room for it under max_routes
            misnamed = misname_first_route(traj, row_registry, misname_rng)
        renamed, question, segments, answers, answer = renamer(q.question, traj.segments, list(q.answers), traj.answer)
        prompt = prompter(question) if listing is None else \
            build_router_prompt(question, row_registry, fill_template(compact, pool=listing.text))
        profile = {ln.spec.name: ln.profile for ln in listing.lines} if listing else {}
        rows.append({
            "data_source": source, "uid": f"{source}-oracle-{index}", "prompt": prompt,
            "response_text": "".join(seg["text"] for seg in segments), "segments": segments, "answers": answers,
            "question": question, "domain": q.domain,
            "mode": "confused" if traj.confused else DRILL if drilled else mode,
            "routes": len(traj.routes), "renamed": renamed,
            "route_models": [m for m, _ in traj.routes], "cost_usd": traj.cost_usd, "misnamed": misnamed or "",
            "em": em_score(answer, answers),
            # a varied row's pool lines, and the pool model answering each route ("" / [] for the pool's own)
            "listing": listing.text if listing else "",
            "route_profiles": [profile[m] for m, _ in traj.routes] if listing else [],
        })
    # Replies of every pool model (unseen too) so the BPE also knows their wording.
    extra = []
    everyone = ModelRegistry.from_yaml(cfg.pool)
    for q in questions[:200]:
        for spec in everyone.models.values():
            extra.append(backend.respond(spec.api_id, submodel_messages(q.hops[0].sub_question), spec.max_tokens)[0])
    return rows, extra


def chat_text(messages: list[dict]) -> str:
    """The messages as the ChatML template renders them (so role words get merges too)."""
    from verl.utils.tiny import EOS, IM_START

    turns = "".join(f"{IM_START}{m['role']}\n{m['content']}{EOS}\n" for m in messages)
    return f"{turns}{IM_START}assistant\n"


def report(rows: list[dict], tokenizer=None) -> str:
    """Summary: EM, routes and cost overall and per mode; token lengths if a tokenizer is given."""
    def line(name, rs):
        n = len(rs)
        return (f"{name:<12} n={n:<5} em={sum(r['em'] for r in rs) / n:.3f} "
                f"routes={sum(r['routes'] for r in rs) / n:.2f} "
                f"cost={1e6 * sum(r['cost_usd'] for r in rs) / n:.2f}e-6 USD")
    out = [line("all", rows)]
    for mode in ("oracle", "confused", DRILL, BIG, *NOISE_MODES):
        rs = [r for r in rows if r["mode"] == mode]
        if rs:
            out.append(line(mode, rs))
    if tokenizer is not None:
        plen, rlen, olen = [], [], []
        for r in rows:
            text = tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
            plen.append(len(tokenizer(text, add_special_tokens=False)["input_ids"]))
            seg = [len(tokenizer(s["text"], add_special_tokens=False)["input_ids"]) for s in r["segments"]]
            rlen.append(sum(seg))
            olen += [k for k, s in zip(seg, r["segments"]) if not s["by_policy"]]
        out.append(f"tokens: prompt mean {sum(plen) / len(plen):.0f} max {max(plen)}; response mean "
                   f"{sum(rlen) / len(rlen):.0f} max {max(rlen)}; observation max {max(olen, default=0)} "
                   f"(set the rollout's max_obs_length above it); vocab {len(tokenizer)}")
    return "\n".join(out)


def run(cfg: OracleConfig) -> dict:
    """Write the oracle parquet (and template, tokenizer, model config); return what was written."""
    import pandas as pd

    from sim.embedded import build_tokenizer, render_compact_template, world_words, write_model_config

    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    template = Path(cfg.prompt_template) if cfg.prompt_template else out / "prompt_template.txt"
    if not cfg.prompt_template:
        template.write_text(render_compact_template(ModelRegistry.from_yaml(cfg.pool).seen()))
    t0 = time.perf_counter()
    rows, extra = build_rows(cfg, template)
    pd.DataFrame(rows).to_parquet(out / "oracle.parquet", index=False)
    written = {"oracle": str(out / "oracle.parquet"), "template": str(template), "rows": len(rows),
               "data_s": time.perf_counter() - t0}
    tok = None
    if cfg.tokenizer:
        t1 = time.perf_counter()
        corpus = [chat_text(r["prompt"]) for r in rows] + [r["response_text"] for r in rows] + extra
        # Model names and the world's names as single tokens: shorter sequences, one-step copies.
        world = SimWorld(seed=cfg.world_seed, n_entities_per_type=cfg.world_entities)
        models = model_names(cfg, world)
        names = token_names(cfg.pool, world, cfg.name_tokens, cfg.whole_names, models)
        tok = build_tokenizer(out / "tokenizer", corpus, cfg.vocab_size, extra_words=names)
        frozen = None
        if cfg.freeze_names:
            if not cfg.name_tokens:
                raise ValueError("--freeze-names needs the names as whole tokens (drop --no-name-tokens)")
            frozen = sorted({tok.convert_tokens_to_ids(w) for w in world_words(world)})
        write_model_config(out / "model.json", tok, json.loads(cfg.model) if cfg.model else None, frozen)
        written.update(tokenizer=str(out / "tokenizer"), model=str(out / "model.json"),
                       tokenizer_s=time.perf_counter() - t1)
    if cfg.report:
        written["report"] = report(rows, tok)
    return written


def add_world_args(p: argparse.ArgumentParser) -> None:
    """The world, pool and question-shape flags every simulated oracle (sim_oracle, sim_oracle_alpha) takes."""
    p.add_argument("--world-seed", type=int, default=0, help="must match the simulated pool's seed")
    p.add_argument("--world-entities", type=int, default=DEFAULT_ENTITIES,
                   help="entities per type of the world (must match the pool server's --world-entities)")
    p.add_argument("--pool", default=str(DEFAULT_POOL), help="pool yaml with sim: profiles (seen models are used)")
    p.add_argument("--prompt-template", default=None, help="template file (default: compact template + compact pool)")
    p.add_argument("--two-hop-frac", type=float, default=0.4, help="share of two-hop questions")
    p.add_argument("--max-routes", type=int, default=3, help="routes per trajectory at most (two hops + one retry)")


def add_vocab_args(p: argparse.ArgumentParser) -> None:
    """The tokenizer, policy-config and name flags every simulated oracle takes."""
    p.add_argument("--no-tokenizer", dest="tokenizer", action="store_false",
                   help="do not train OUT/tokenizer nor write OUT/model.json")
    p.add_argument("--vocab-size", type=int, default=1024, help="BPE merges' vocabulary (names and tags come on top)")
    p.add_argument("--whole-names", action="store_true",
                   help="each multi-word entity name (a person, a company) is one token too, so copying it is one step")
    p.add_argument("--rename", type=float, default=0.0,
                   help="share of trajectories whose entity names are renamed to other names of the world "
                        "(so the SFT data shows every name being copied)")
    p.add_argument("--model", default=None,
                   help='JSON of model config keys over the embedded default\'s (e.g. \'{"num_hidden_layers": 4}\')')


def parse_args(argv: list[str] | None = None) -> OracleConfig:
    p = argparse.ArgumentParser(prog="python -m data_process.sim_oracle", description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default="data/embedded",
                   help="where oracle.parquet, the tokenizer, model.json and prompt_template.txt are written")
    p.add_argument("--n", type=size_arg, default=2000, help="trajectories (simulated train questions)")
    p.add_argument("--noise", type=float, default=0.3, help="probability of a suboptimal trajectory")
    p.add_argument("--prefer-big", type=float, default=0.0,
                   help="probability that the annotator sends the question to the strongest generalist")
    p.add_argument("--confuse", type=float, default=0.0,
                   help="probability that an oracle-mode hop of a --confuse-domains domain goes to the cheap "
                        "model weakest on it (the annotator's systematic mix-up)")
    p.add_argument("--confuse-domains", type=lambda v: tuple(x for x in v.split(",") if x), default=("people", "science"),
                   help="comma-separated domains the annotator mixes up (default people,science)")
    p.add_argument("--seed", type=int, default=0, help="question draw and noise seed")
    add_world_args(p)
    p.add_argument("--report", action="store_true", help="print EM, routes, cost and token lengths")
    add_vocab_args(p)
    p.add_argument("--no-name-tokens", dest="name_tokens", action="store_false",
                   help="leave the world's names to the BPE instead of one whole token each")
    p.add_argument("--vary-pool", type=float, default=0.0,
                   help="share of rows whose prompt lists a pool of its own (random models, names from a bank, "
                        "prices), routed to the cheapest listed model naming the domain (sim/pool_variation.py)")
    p.add_argument("--add-rival", type=float, default=0.0,
                   help="share of rows whose prompt lists the pool's own models plus one made-up model (a rival "
                        "line, cheaper --rival-cheaper of the time), routed to the cheapest listed model naming the domain")
    p.add_argument("--think-candidates", action="store_true",
                   help="each oracle-mode hop's <think> states the listed models naming its domain with their prices "
                        "before picking the cheapest (slips keep the short think)")
    p.add_argument("--bank-size", type=int, default=BANK_SIZE,
                   help="made-up model names the varied and rival lines draw from (many: each name is seen a few "
                        "times, so the router learns to copy names it does not know)")
    p.add_argument("--bank-styles", action="store_true",
                   help="bank names in the shapes real model names take (Kavo2.5-7B-Instruct, KAVO-7B, KavoLM-7B, "
                        "Kavo-7B-Chat), not Kavo-7B only")
    p.add_argument("--rival-cheaper", type=float, default=RIVAL_CHEAPER,
                   help="share of rival lines priced below the listing's pick for their domains (else above)")
    p.add_argument("--fallback", choices=FALLBACKS, default="best",
                   help="after a reply without an answer ask the most reliable other model (best), or the cheapest "
                        "other listed line naming the hop's domain, stated in the think (listed; needs "
                        "--think-candidates; each made-up line is then a model of its own)")
    p.add_argument("--fallback-drill", type=float, default=0.0,
                   help="share of oracle-mode rows given a cheaper rival line for the first hop's domain that has no "
                        "answer to it, so the listed fallback is shown often (needs --fallback listed)")
    p.add_argument("--misname-drill", type=float, default=0.0,
                   help="share of oracle-mode rows whose first route misspells its pick's name, then reads the "
                        "invalid-action hint and routes again under the listed name; the slip is not learnt "
                        "(needs --think-candidates; evaluate with --invalid-hint)")
    p.add_argument("--freeze-names", action="store_true",
                   help="write the names' token ids into model.json as frozen_token_ids (their embedding rows stay "
                        "at their random start: a copy circuit that generalises to names training never showed)")
    return OracleConfig(**vars(p.parse_args(argv)))


def main(argv: list[str] | None = None, parse=parse_args, build=run) -> int:
    """The CLI: parse, build, print what was written (errors as one line, exit 1).

    `parse` / `build` let another oracle (sim_oracle_budget) share it."""
    cfg = parse(argv)
    try:
        written = build(cfg)
    except (DataBuildError, TemplateError, RegistryError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {written['oracle']}: {written['rows']} rows ({written['data_s']:.1f}s); template {written['template']}")
    if "tokenizer" in written:
        print(f"wrote {written['tokenizer']} and {written['model']} ({written['tokenizer_s']:.1f}s)")
    if "report" in written:
        print(written["report"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
