"""Pool listings that vary per SFT row, so the router learns to read the listed lines (issue 31).

A router trained on one listing (the compact template's six lines) routes by position and by a memorised
name token: a new line for a model it never saw shifts it and is never chosen
(docs/results/alpha_conditioned, "The unseen model"). Here each varied row gets its own listing: a random
subset and order of the pool's seen profiles, each under a name drawn from a bank shared by all profiles
(so a name says nothing about what its model knows), at a random price, specialists sometimes listed
with one of their domains only, and rival lines (the same profile under a second name and price) naming
the same domain. The oracle's choice for a domain is the cheapest listed line that names it: what makes
a new "SciGLM-6B $0.05: science" line the pick over "Qwen2.5-7B-Instruct $0.30: science, business".
A listing by heart beats the rule (docs/results/h200/gemma_unseen), so `with_rival` also gives rows the pool's
own listing plus one made-up line, cheaper than the pick for its domains `rival_cheaper` of the time, else dearer:
the familiar listing is then a case of the rule too, and a new line is the pick only when its price says so.

Every line's name resolves, in the row's own registry (Listing.registry), to a spec with its profile's
api_id, so the simulated backend answers as that profile and check_format accepts the routes. The names
are whole tokens of the tokenizer, each copied in many rows; a name no row shows (the unseen model's) gets
a row drawn like theirs before it is offered (tools/analysis/new_model_names.py).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, replace

from sim.embedded import GENERALIST_ACCURACY, STRONG_ACCURACY, domain_accuracy, model_topics, pool_line
from router_r1.pool.registry import ModelRegistry, ModelSpec, normalize_name
from sim.world import DOMAINS

BANK_SIZE = 96
_ONSETS = "bdfghklmnprstvz"
_VOWELS = "aeiou"
_SIZES = (1, 2, 3, 4, 6, 7, 8, 9, 12, 14, 22, 32, 34, 70, 72)
# Shown prices (USD per 1M output tokens): a specialist's in the cheap band, a generalist's in the dear
# one, as in the pools this router serves; SciGLM-6B's $0.05 and every seen price lie inside.
SPECIALIST_PRICES = tuple(round(0.01 * k, 2) for k in range(3, 46))
GENERALIST_PRICES = tuple(round(0.05 * k, 2) for k in range(10, 31))
KEEP = 0.75  # P(a specialist profile is listed) before coverage is completed
ONE_TOPIC = 0.5  # P(a specialist line names one of its domains only)
RIVALS = (0, 1, 1, 2)  # extra lines of an already listed specialist profile, at another price
LIST_GENERALIST = 0.6  # P(a generalist profile is listed); at least one always is
RIVAL_CHEAPER = 0.7  # P(with_rival's line undercuts the listing's pick for its domains)
# The shapes real model names take (a styled bank's): "Kavo-7B", "Kavo2.5-7B-Instruct", "KAVO-7B", "KavoLM-7B",
# "Kavo-7B-Chat"; the plain bank has the first only
_STYLES = ("{Stem}-{n}B", "{Stem}{v}-{n}B-Instruct", "{STEM}-{n}B", "{Stem}LM-{n}B", "{Stem}-{n}B-Chat")
_VERSIONS = ("2", "2.5", "3", "3.1")


def name_bank(size: int = BANK_SIZE, reserved: set[str] = frozenset(), seed: int = 0,
              styled: bool = False) -> list[str]:
    """`size` made-up model names ("Kavo-7B"; `styled`: in the shapes of _STYLES too), distinct after registry
    normalisation and none in `reserved`."""
    rng = random.Random(f"model-names-{seed}")
    taken = {normalize_name(w) for w in reserved}
    names = []
    for _ in range(100 * size):
        if len(names) == size:
            return names
        stem = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.choice((2, 2, 3))))
        name = f"{stem.capitalize()}-{rng.choice(_SIZES)}B"
        if styled:  # its own draws after the plain name's, so the plain bank is unchanged
            name = rng.choice(_STYLES).format(Stem=stem.capitalize(), STEM=stem.upper(), n=rng.choice(_SIZES),
                                              v=rng.choice(_VERSIONS))
        if normalize_name(name) not in taken and stem.capitalize() not in reserved:
            taken.add(normalize_name(name))
            names.append(name)
    raise ValueError(f"name_bank: only {len(names)} of {size} names are free of the reserved words")


def strong_domains(spec: ModelSpec) -> tuple[str, ...]:
    """The domains `spec`'s sim profile is reliable on (STRONG_ACCURACY), in DOMAINS order."""
    return tuple(d for d, p in domain_accuracy(spec).items() if p >= STRONG_ACCURACY)


def is_generalist(spec: ModelSpec) -> bool:
    """Right at least GENERALIST_ACCURACY of the time on every domain: listed as "all topics"."""
    return min(domain_accuracy(spec).values()) >= GENERALIST_ACCURACY


@dataclass(frozen=True)
class Line:
    """One listed model: `spec` is its profile's under the shown name and price; `topics` the domains the line
    names (empty for a generalist's "all topics" line)."""

    spec: ModelSpec
    profile: str  # the pool model whose sim profile answers (its canonical name)
    topics: tuple[str, ...]

    @property
    def text(self) -> str:
        return pool_line(self.spec, ", ".join(self.topics) if self.topics else model_topics(self.spec))


@dataclass(frozen=True)
class Listing:
    """A row's pool: its lines in prompt order."""

    lines: tuple[Line, ...]

    @property
    def text(self) -> str:
        """The compact template's {pool}."""
        return "\n".join(line.text for line in self.lines)

    @property
    def registry(self) -> ModelRegistry:
        """Each shown name -> a spec with its profile's api_id (what the backend answers as) and the shown price."""
        return ModelRegistry([line.spec for line in self.lines], source="<varied listing>")

    def naming(self, domain: str) -> tuple[Line, ...]:
        """The lines naming `domain`, in listing order; the generalists' lines if none does."""
        return tuple(ln for ln in self.lines if domain in ln.topics) or tuple(ln for ln in self.lines if not ln.topics)

    def choice(self, domain: str) -> ModelSpec:
        """The cheapest listed line naming `domain` (the first listed of equal prices); a generalist if none does."""
        naming = self.naming(domain)
        if not naming:
            raise ValueError(f"listing names no model for {domain!r} and has no generalist: {self.text!r}")
        return min(naming, key=lambda ln: ln.spec.price_out_per_m).spec

    def choices(self) -> dict[str, ModelSpec]:
        """The oracle's specialist per domain (oracle.Oracle's `specialist`)."""
        return {d: self.choice(d) for d in DOMAINS}


def canonical_listing(registry: ModelRegistry) -> Listing:
    """The pool's own listing: every model under its name and price, in the yaml's order (compact_pool_text's)."""
    return Listing(tuple(Line(s, s.name, () if is_generalist(s) else strong_domains(s))
                         for s in registry.models.values()))


class PoolVariation:
    """Draws a row's listing over a registry's profiles (seen models with sim profiles)."""

    def __init__(self, registry: ModelRegistry, bank: list[str], rival_cheaper: float = RIVAL_CHEAPER):
        """`rival_cheaper`: P(with_rival's line undercuts the listing's pick for its domains)."""
        if not 0.0 <= rival_cheaper <= 1.0:
            raise ValueError(f"rival_cheaper must be in [0, 1], got {rival_cheaper}")
        self.rival_cheaper = rival_cheaper
        self.profiles = list(registry.models.values())
        self.specialists = [s for s in self.profiles if not is_generalist(s)]
        self.generalists = [s for s in self.profiles if is_generalist(s)]
        if not self.generalists:
            raise ValueError(f"{registry.source}: pool variation needs a generalist (>= {GENERALIST_ACCURACY} "
                             "on every domain)")
        for d in DOMAINS:
            if not any(d in strong_domains(s) for s in self.specialists):
                raise ValueError(f"{registry.source}: pool variation needs a specialist for {d!r}")
        if len(bank) < len(self.profiles) + max(RIVALS):
            raise ValueError(f"pool variation: a bank of {len(bank)} names is too small for one listing")
        self.bank = list(bank)

    def draw(self, rng: random.Random) -> Listing:
        """A random listing: every domain named by a specialist line, one generalist at least, names from the bank."""
        picked: list[tuple[ModelSpec, tuple[str, ...]]] = []
        for s in rng.sample(self.specialists, len(self.specialists)):
            if rng.random() < KEEP:
                picked.append((s, self._shown(s, rng)))
        for d in DOMAINS:
            if not any(d in topics for _, topics in picked):
                s = rng.choice([s for s in self.specialists if d in strong_domains(s)])
                picked.append((s, strong_domains(s) if rng.random() >= ONE_TOPIC else (d,)))
        for _ in range(rng.choice(RIVALS)):
            s, _topics = rng.choice([p for p in picked if p[1]])
            picked.append((s, self._shown(s, rng)))
        gens = [g for g in self.generalists if rng.random() < LIST_GENERALIST] or [rng.choice(self.generalists)]
        picked += [(g, ()) for g in gens]
        rng.shuffle(picked)
        names = rng.sample(self.bank, len(picked))
        spec_prices = rng.sample(SPECIALIST_PRICES, len(picked))  # distinct: one cheapest per domain
        gen_prices = rng.sample(GENERALIST_PRICES, len(picked))
        lines = []
        for (s, topics), name, sp, gp in zip(picked, names, spec_prices, gen_prices):
            spec = replace(s, name=name, aliases=(), price_out_per_m=sp if topics else gp, unseen=False)
            lines.append(Line(spec, s.name, topics))
        return Listing(tuple(lines))

    def with_rival(self, listing: Listing, rng: random.Random) -> Listing:
        """`listing` (normally canonical_listing) plus one specialist line under a bank name, at a random place,
        priced below the listing's pick for each of its topics (`rival_cheaper` of the time) or above them all."""
        spec = rng.choice(self.specialists)
        topics = self._shown(spec, rng)
        taken = {normalize_name(ln.spec.name) for ln in listing.lines}
        name = rng.choice([b for b in self.bank if normalize_name(b) not in taken])
        picks = [listing.choice(d).price_out_per_m for d in topics]
        below = [p for p in SPECIALIST_PRICES if p < min(picks)]
        above = [p for p in SPECIALIST_PRICES if p > max(picks)]
        prices = below if rng.random() < self.rival_cheaper else above
        price = rng.choice(prices or below or above)
        return self._insert(listing, spec, name, price, topics, rng)

    def drill_rival(self, listing: Listing, rng: random.Random, domain: str, fails) -> Listing | None:
        """`listing` plus a rival line naming `domain`, cheaper than the listing's pick for each of its topics, under
        a bank name for which `fails(name, spec)` (the fallback drill, listings.py); None if no free name fails."""
        spec = rng.choice([s for s in self.specialists if domain in strong_domains(s)])
        topics = strong_domains(spec) if rng.random() >= ONE_TOPIC else (domain,)
        taken = {normalize_name(ln.spec.name) for ln in listing.lines}
        names = [b for b in self.bank if normalize_name(b) not in taken and fails(b, spec)]
        below = [p for p in SPECIALIST_PRICES if p < min(listing.choice(d).price_out_per_m for d in topics)]
        if not names or not below:
            return None
        return self._insert(listing, spec, rng.choice(names), rng.choice(below), topics, rng)

    @staticmethod
    def _insert(listing: Listing, spec: ModelSpec, name: str, price: float, topics: tuple[str, ...],
                rng: random.Random) -> Listing:
        line = Line(replace(spec, name=name, aliases=(), price_out_per_m=price, unseen=False), spec.name, topics)
        at = rng.randint(0, len(listing.lines))
        return Listing(listing.lines[:at] + (line,) + listing.lines[at:])

    @staticmethod
    def _shown(spec: ModelSpec, rng: random.Random) -> tuple[str, ...]:
        strong = strong_domains(spec)
        return strong if rng.random() >= ONE_TOPIC else (rng.choice(strong),)
