"""Rows whose prompt lists a pool of its own, and thinks that read the listing (issue 31's unseen model).

`VariedListings` gives a share of rows their own listing (pool_variation.py: random subsets, orders, names and
prices), routed to the cheapest listed model naming the hop's domain, so the policy reads the listing instead of
memorising it and a model it never saw can be picked from its line (docs/results/unseen_model). `Rivals` gives a
share the pool's own listing plus one made-up line, so the familiar listing obeys that rule too. `ThinkCandidates`
makes each oracle-mode hop's <think> restate the listed candidates with their prices before the pick, so the pick is
a copy from a few tokens back (as restating the cost weight made the alpha take: docs/results/h200/gemma_alpha).
`Fallback` "listed" asks, after a reply without an answer, the cheapest other listed line naming the domain, each
made-up line a model of its own; its drill gives a share of rows a cheaper rival line that has no answer for the
first hop, so that fallback is shown often enough to be learned (docs/results/h200/gemma_unseen/fallback).
`ListingStyle` picks the listing the template keeps: the domains each model is good at, or its model card.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from router_r1.pool.listing import LISTINGS
from router_r1.pool.registry import ModelRegistry, ModelSpec
from router_r1.pool.messages import submodel_messages
from router_r1.prompts import with_pool
from sim.backend import SimBackend, SimExpert, last_user_text
from sim.embedded import COMPACT_TEMPLATE, priced_name, world_words
from sim.warm_start.oracle import FALLBACKS, reply_answer
from sim.warm_start.pool_variation import (BANK_SIZE, RIVAL_CHEAPER, Listing, PoolVariation, canonical_listing,
                                           name_bank)
from sim.world import SimQuestion, SimWorld


def _share(flag: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{flag} must be in [0, 1], got {value}")


def _hops_only(recipe, flag: str) -> None:
    if not recipe.hop_routes:
        raise ValueError(f"{flag} shapes the hop-by-hop oracle's rows: drop it with --alphas, --budgets or "
                         "--routes uniform")


def _no_template(recipe, flag: str) -> None:
    if recipe.build.prompt_template:
        raise ValueError(f"{flag} lists each row's own pool in the compact template: drop --prompt-template")


@dataclass
class VariedListings:
    """A share of rows list a pool of their own, their names from a bank of made-up names."""

    vary_pool: float = 0.0  # share of rows whose prompt lists a pool of its own (random models, names from a bank, prices), routed to the cheapest listed model naming the domain
    bank_size: int = BANK_SIZE  # made-up model names the varied and rival lines draw from (many: each is seen a few times, so the router learns to copy names it does not know, as it must the unseen model's)
    bank_styles: bool = False  # bank names in the shapes real model names take (Kavo2.5-7B-Instruct, KAVO-7B, KavoLM-7B, Kavo-7B-Chat), not Kavo-7B only, so a new model's name is not the one shape no row shows

    def __post_init__(self):
        _share("--vary-pool", self.vary_pool)

    def check(self, recipe) -> None:
        if self.vary_pool > 0:
            _hops_only(recipe, "--vary-pool")
            _no_template(recipe, "--vary-pool")


@dataclass
class Rivals:
    """A share of rows list the pool's own models plus one made-up rival line."""

    add_rival: float = 0.0  # share of rows whose prompt lists the pool's own models plus one made-up model (a rival line, cheaper --rival-cheaper of the time), routed to the cheapest listed model naming the domain (--vary-pool + --add-rival <= 1)
    rival_cheaper: float = RIVAL_CHEAPER  # share of rival lines priced below the listing's pick for their domains (else above); at 0.7 "ask the made-up name" is right in most two-line decisions without reading a price

    def __post_init__(self):
        _share("--rival-cheaper", self.rival_cheaper)

    def check(self, recipe) -> None:
        vary = recipe.varied_listings.vary_pool
        if self.add_rival < 0.0 or vary + self.add_rival > 1.0:
            raise ValueError(f"--add-rival must be >= 0 with --vary-pool + --add-rival <= 1, got {self.add_rival} "
                             f"(--vary-pool {vary})")
        if self.add_rival > 0:
            _hops_only(recipe, "--add-rival")
            _no_template(recipe, "--add-rival")


@dataclass
class ThinkCandidates:
    """Each oracle-mode hop's <think> restates the listed lines naming its domain before the pick."""

    think_candidates: bool = False  # each oracle-mode hop's <think> states the listed models naming its domain with their prices (the pool's own listing for rows without one) before picking the cheapest; slips keep the short think

    def check(self, recipe) -> None:
        if self.think_candidates:
            _hops_only(recipe, "--think-candidates")

    def check_template(self, template_path: str | Path, canonical: Listing, registry: ModelRegistry) -> None:
        """The plain rows' thinks restate their prompt's lines: the template, listing `registry`, must show them as
        the listing does."""
        if not self.think_candidates:
            return
        shown = with_pool(Path(template_path).read_text(), registry)
        missing = [priced_name(ln.spec) for ln in canonical.lines if priced_name(ln.spec) not in shown]
        if missing:
            raise ValueError(f"--think-candidates: {template_path} does not list {', '.join(missing)} as the "
                             "compact listing shows them: drop --prompt-template")


LISTING_STYLES = ("domains", "card")  # the compact template's listings (router_r1/pool/listing.py)


@dataclass
class ListingStyle:
    """How the compact template lists the pool: by the domains each model is good at, or by its model card."""

    listing: str = field(default="domains", metadata={"choices": LISTING_STYLES})  # the listing OUT/prompt_template.txt keeps as its placeholder, filled from the pool in use wherever the router is prompted (data, training, evaluation, infer.py, the server): domains ("Qwen2.5-7B-Instruct $0.30: science, business") or card (name, input and output price, the pool yaml's one-line `card`; no domains)

    def __post_init__(self):
        if self.listing not in LISTING_STYLES:
            raise ValueError(f"--listing must be one of {', '.join(LISTING_STYLES)}, got {self.listing!r}")

    @property
    def placeholder(self) -> str:
        return "{" + LISTINGS[self.listing] + "}"

    def check(self, recipe) -> None:
        if self.listing == "domains":
            return
        if recipe.build.prompt_template:
            raise ValueError("--listing card writes the compact template's listing: drop --prompt-template (a "
                             "template of your own lists the pool by the placeholder it has)")
        shown_domains = {"--vary-pool": recipe.varied_listings.vary_pool > 0,
                         "--add-rival": recipe.rivals.add_rival > 0,
                         "--think-candidates": recipe.thinking.think_candidates,
                         "--fallback listed": recipe.fallback.fallback == "listed"}
        clash = [flag for flag, on in shown_domains.items() if on]
        if clash:
            raise ValueError(f"--listing card shows no domains, and {', '.join(clash)} reads them from the listing: "
                             "drop it with --listing card")
        bare = [s.name for s in ModelRegistry.from_yaml(recipe.build.pool).seen().models.values() if not s.card]
        if bare:
            raise ValueError(f"--listing card: {recipe.build.pool} has no `card` line for {', '.join(bare)}")


@dataclass
class Fallback:
    """Who is asked after a reply without an answer, and a drill that shows it."""

    fallback: str = field(default="best", metadata={"choices": FALLBACKS})  # after a reply without an answer ask the most reliable other model (best), or the cheapest other listed line naming the hop's domain, stated in the think (listed; needs --think-candidates; each made-up line is then a model of its own)
    fallback_drill: float = 0.0  # share of oracle-mode rows given a cheaper rival line for the first hop's domain that has no answer to it, so the listed fallback is shown often (needs --fallback listed)

    def __post_init__(self):
        if self.fallback not in FALLBACKS:
            raise ValueError(f"--fallback must be one of {', '.join(FALLBACKS)}, got {self.fallback!r}")
        if not 0.0 <= self.fallback_drill <= 1.0 or (self.fallback_drill > 0 and self.fallback != "listed"):
            raise ValueError(f"--fallback-drill must be in [0, 1], and > 0 only with --fallback listed, got "
                             f"{self.fallback_drill} (--fallback {self.fallback})")

    def check(self, recipe) -> None:
        if self.fallback == "listed":
            if not recipe.thinking.think_candidates:
                raise ValueError("--fallback listed states the lines left in the think: add --think-candidates")
            _hops_only(recipe, "--fallback listed")


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


def variation(recipe, registry: ModelRegistry, world: SimWorld) -> PoolVariation:
    """The listings over the seen models, their names from a bank clear of the pool's, the world's and the
    template's words."""
    pool, varied = recipe.build.pool, recipe.varied_listings
    reserved = set(ModelRegistry.from_yaml(pool).names) | set(world_words(world)) | \
        set(re.findall(r"\w+", COMPACT_TEMPLATE.read_text()))
    bank = name_bank(varied.bank_size, reserved=reserved, seed=recipe.build.world_seed, styled=varied.bank_styles)
    return PoolVariation(registry, bank, recipe.rivals.rival_cheaper)


def bank_names(recipe, world: SimWorld) -> list[str]:
    """The bank's names, which the tokenizer keeps whole, when varied or rival lines show them."""
    if recipe.varied_listings.vary_pool > 0 or recipe.rivals.add_rival > 0:
        return variation(recipe, ModelRegistry.from_yaml(recipe.build.pool).seen(), world).bank
    return []


def drill_listing(pools: PoolVariation, canonical: Listing, backend: SimBackend, q: SimQuestion,
                  rng: random.Random) -> Listing | None:
    """The pool's own listing plus a cheaper rival line for `q`'s first hop domain whose twin has no answer to that
    hop (the fallback drill); None if no bank name's twin lacks one."""
    hop = q.hops[0]
    query = last_user_text(submodel_messages(hop.sub_question))  # as the backend reads the oracle's ask

    def fails(name: str, spec: ModelSpec) -> bool:
        return reply_answer(twin_expert(backend, spec.api_id, name).reply(query)) is None
    return pools.drill_rival(canonical, rng, hop.domain, fails)


class RowListings:
    """Each row's listing: the pool's own (None), a varied one, the pool's plus a rival line, or a drill's."""

    def __init__(self, recipe, registry: ModelRegistry, world: SimWorld, backend: SimBackend):
        self.vary, self.rival = recipe.varied_listings.vary_pool, recipe.rivals.add_rival
        self.drill = recipe.fallback.fallback_drill
        self.backend = backend
        self.canonical = canonical_listing(registry)  # the plain rows' listing; a rival row's, plus one line
        self.pools = variation(recipe, registry, world) if self.vary + self.rival + self.drill > 0 else None
        seed = recipe.build.seed
        self.vary_rng = random.Random(f"vary-pool-{seed}")  # its own stream: questions and noise as without
        self.drill_rng = random.Random(f"fallback-drill-{seed}")  # and the drill's

    def draw(self, q: SimQuestion, mode: str) -> tuple[Listing | None, bool]:
        """(the row's listing or None for the pool's own, whether it is a drill's)."""
        listing = None
        u = self.vary_rng.random() if self.pools is not None else 1.0  # one draw a row: old seeds give old data
        if u < self.vary:
            listing = self.pools.draw(self.vary_rng)
        elif u < self.vary + self.rival:
            listing = self.pools.with_rival(self.canonical, self.vary_rng)
        drilled = None
        if self.drill > 0 and self.drill_rng.random() < self.drill and mode == "oracle":
            drilled = drill_listing(self.pools, self.canonical, self.backend, q, self.drill_rng)
            listing = drilled or listing
        return listing, drilled is not None
