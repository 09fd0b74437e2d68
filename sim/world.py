"""A synthetic world of made-up entities and facts, with one- and two-hop questions.

Every name comes from a syllable generator, so no pretrained policy can know a fact:
it has to ask the pool. Everything is a function of the seed alone (random.Random and
sha256, never the salted built-in hash), so the same seed gives the same world, the
same questions and the same train/test split on any machine.
"""
from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field

DOMAINS = ("geography", "people", "science", "arts", "business", "sports")

# A token is a run of word characters or one punctuation mark: simple, deterministic,
# and close enough to BPE counts (a few % per English word) for cost bookkeeping.
_TOKEN = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str) -> int:
    """Number of tokens of `text` under the world's word/punctuation tokenizer."""
    return len(_TOKEN.findall(text))


def truncate_tokens(text: str, max_tokens: int) -> tuple[str, bool]:
    """`text` cut after its first `max_tokens` tokens (original spacing kept), and whether it was cut."""
    if max_tokens <= 0:
        return "", bool(text.strip())
    for i, m in enumerate(_TOKEN.finditer(text)):
        if i == max_tokens:
            return text[:m.start()].rstrip(), True
    return text, False


def stable_int(*parts: object) -> int:
    """A 64-bit integer from sha256 of the parts: identical on every machine and run."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def stable_unit(*parts: object) -> float:
    """A number in [0, 1) from sha256 of the parts (a seed-stable coin)."""
    return stable_int(*parts) / 2.0**64


@dataclass(frozen=True)
class Relation:
    """A function from entities of type `subj` to entities of type `obj`."""

    name: str
    domain: str
    subj: str
    obj: str
    questions: tuple[str, ...]  # question templates over {s}
    phrase: str  # noun phrase for the object, used inside two-hop questions: "the capital of {s}"
    statement: str  # how an expert states the fact: "The capital of {s} is {o}."
    keywords: re.Pattern  # words that signal this relation in a free-form query

    def ask(self, subject: str, variant: int = 0) -> str:
        return self.questions[variant % len(self.questions)].format(s=subject)

    def state(self, subject: str, obj: str) -> str:
        text = self.statement.format(s=subject, o=obj)
        return text[0].upper() + text[1:]


def _kw(pattern: str) -> re.Pattern:
    return re.compile(pattern, re.IGNORECASE)


RELATIONS: dict[str, Relation] = {r.name: r for r in (
    Relation("capital", "geography", "country", "city",
             ("What is the capital of {s}?", "Which city is the capital of {s}?"),
             "the capital of {s}", "The capital of {s} is {o}.", _kw(r"\bcapital\b")),
    Relation("located_in", "geography", "city", "country",
             ("In which country is {s}?", "Which country is {s} located in?"),
             "the country where {s} is located", "{s} is located in {o}.", _kw(r"\b(country|nation)\b")),
    Relation("born_in", "people", "person", "city",
             ("In which city was {s} born?", "Where was {s} born?"),
             "the birthplace of {s}", "{s} was born in {o}.", _kw(r"\b(born|birthplace|birth)\b")),
    Relation("mentor", "people", "person", "person",
             ("Who was the mentor of {s}?", "Who mentored {s}?"),
             "the mentor of {s}", "{s} was mentored by {o}.", _kw(r"\bmentor(ed|s)?\b")),
    Relation("discovered_by", "science", "element", "person",
             ("Who discovered {s}?", "Which scientist discovered {s}?"),
             "the discoverer of {s}", "{s} was discovered by {o}.", _kw(r"\bdiscover\w*")),
    Relation("symbol", "science", "element", "symbol",
             ("What is the chemical symbol of {s}?", "Which symbol stands for {s}?"),
             "the chemical symbol of {s}", "The chemical symbol of {s} is {o}.", _kw(r"\bsymbols?\b")),
    Relation("genre", "arts", "band", "genre",
             ("What genre of music does {s} play?", "Which genre is {s} known for?"),
             "the genre of {s}", "{s} plays {o}.", _kw(r"\bgenres?\b")),
    Relation("formed_in", "arts", "band", "city",
             ("In which city was {s} formed?", "Where was the band {s} formed?"),
             "the hometown of {s}", "{s} was formed in {o}.", _kw(r"\b(formed|hometown)\b")),
    Relation("leader", "arts", "band", "person",
             ("Who is the lead singer of {s}?", "Who leads the band {s}?"),
             "the lead singer of {s}", "The lead singer of {s} is {o}.", _kw(r"\b(lead|leads|leader|singer|frontman)\b")),
    Relation("founder", "business", "company", "person",
             ("Who founded {s}?", "Who is the founder of {s}?"),
             "the founder of {s}", "{s} was founded by {o}.", _kw(r"\b(founded|founder|founders)\b")),
    Relation("headquarters", "business", "company", "city",
             ("In which city is {s} headquartered?", "Where are the headquarters of {s}?"),
             "the headquarters city of {s}", "{s} is headquartered in {o}.", _kw(r"\b(headquarter\w*|hq|based)\b")),
    Relation("home_city", "sports", "team", "city",
             ("In which city does {s} play its home games?", "Where is {s} based?"),
             "the home city of {s}", "{s} plays its home games in {o}.", _kw(r"\b(home|based)\b")),
    Relation("coach", "sports", "team", "person",
             ("Who coaches {s}?", "Who is the head coach of {s}?"),
             "the coach of {s}", "{s} is coached by {o}.", _kw(r"\bcoach\w*")),
)}
# Two-hop chains that lead back to where they started ask nothing; the world never
# generates them and the parser never reads a query as one.
TRIVIAL_CHAINS = {("capital", "located_in"), ("mentor", "mentor")}

DEFAULT_ENTITIES = 150  # entities per type: ~2,000 one-hop train questions; more for bigger models

# Entities per type, as multiples of n_entities_per_type (cities and people are the
# objects of many relations, so there are more of them).
_TYPE_SCALE = {"country": 1, "city": 3, "person": 3, "company": 1, "band": 1, "team": 1, "element": 1}
_N_GENRES = 12
_SUFFIX = {
    "company": ("Works", "Labs", "Industries", "Systems", "Holdings", "Dynamics"),
    "band": ("Collective", "Ensemble", "Quartet", "Brothers", "Choir", "Express"),
    "team": ("Rovers", "Falcons", "Comets", "Wolves", "Titans", "Mariners"),
}
# Syllables for names like "Velmora" or "Dunmere": short, pronounceable, few BPE tokens.
_ONSETS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "th")
_NUCLEI = ("a", "e", "i", "o", "u", "a", "e", "o")
_CODAS = ("", "", "", "n", "r", "l", "s", "m", "nd", "rk")
_COMMON = set("""a an the in is it at of on to by be as or if me my no so up we he do go us am hi oh ok
    and not are was who what where which know have here were more made make like time some home same came come
    gone done give live love move name note none sure take tell told tone vote base bore date dome dose fame fate
    file fine fire form gate game gave hero hole hope kite lake lane late line lore lose male mane mate mile mine
    mode more nine pale pile pole rate ride rise role rose rule safe sale site sole tale tide tune zone data demo
    memo zero solo halo veto polo sofa soda lava diva nova tuna motor voter river lover never fever lever seven
    baron metal total moral medal hotel label model novel panel level solid rapid valid lemon melon manor minor
    major honor tenor sonar lunar solar polar radar super paper tiger timer later meter final vital rival forum
    these those there three theme then than that this thus her his him them tom dan ben sam kim""".split())
# Words the templates use may never be (part of) a name, so they cannot be mistaken for one.
_RESERVED = _COMMON | {w.lower() for r in RELATIONS.values()
                       for t in (*r.questions, r.phrase, r.statement) for w in re.findall(r"\w+", t)} \
    | {w.lower() for words in _SUFFIX.values() for w in words}


@dataclass(frozen=True)
class Entity:
    name: str
    type: str
    aliases: tuple[str, ...] = ()  # shorter forms a query may use (last name, name without suffix)


@dataclass(frozen=True)
class Fact:
    relation: str
    subject: str
    object: str

    @property
    def key(self) -> str:
        """Stable identity of the fact, used by every seed-stable coin about it."""
        return f"{self.relation}({self.subject})"

    @property
    def domain(self) -> str:
        return RELATIONS[self.relation].domain


@dataclass(frozen=True)
class Hop:
    sub_question: str
    answer: str
    domain: str
    relation: str
    subject: str


@dataclass
class SimQuestion:
    uid: str
    question: str
    answers: list[str]
    hops: list[Hop]  # the oracle decomposition, in order
    domain: str  # a hop's domain; two-hop questions join them: "business>people"
    split: str = "train"


@dataclass(frozen=True)
class Parse:
    """What a free-form query asks: an entity and a chain of relations (empty if unclear)."""

    entity: Entity
    relations: tuple[Relation, ...] = field(default=())


class SimWorld:
    """Entities, facts, questions with oracle decompositions, and a query parser."""

    def __init__(self, seed: int = 0, n_entities_per_type: int = DEFAULT_ENTITIES, test_frac: float = 0.3):
        if n_entities_per_type < 4:
            raise ValueError(f"SimWorld: n_entities_per_type must be >= 4, got {n_entities_per_type}")
        if not 0.0 < test_frac < 1.0:
            raise ValueError(f"SimWorld: test_frac must be in (0, 1), got {test_frac}")
        self.seed, self.n, self.test_frac = seed, n_entities_per_type, test_frac
        rng = random.Random(stable_int("sim-world", seed))
        self.entities: dict[str, Entity] = {}
        self.by_type: dict[str, list[str]] = {}
        self.facts: dict[tuple[str, str], str] = {}  # (relation, subject) -> object
        self._make_entities(rng)
        self._make_facts(rng)
        self._lookup = {k.lower(): e for e in self.entities.values() for k in (e.name, *e.aliases)}
        self._max_words = max(len(k.split()) for k in self._lookup)
        self._pools: dict[str, tuple[dict, dict]] = {}
        self._chains: list[tuple[Fact, Fact]] | None = None

    # ---- construction -------------------------------------------------------------------

    def _make_entities(self, rng: random.Random) -> None:
        used: set[str] = set()

        def stem(n_syl: int = 0) -> str:
            while True:
                k = n_syl or (2 if rng.random() < 0.8 else 3)
                # open syllables and one final coda keep names short and readable
                s = "".join(rng.choice(_ONSETS) + rng.choice(_NUCLEI) for _ in range(k)) + rng.choice(_CODAS)
                if 3 <= len(s) <= 9 and s not in used and s not in _RESERVED:
                    used.add(s)
                    return s.capitalize()

        def add(name: str, etype: str, aliases: tuple[str, ...] = ()) -> None:
            self.entities[name] = Entity(name, etype, aliases)
            self.by_type.setdefault(etype, []).append(name)

        for etype, scale in _TYPE_SCALE.items():
            for _ in range(scale * self.n):
                if etype == "person":
                    first, last = stem(), stem()
                    add(f"{first} {last}", etype, (last,))
                elif etype in _SUFFIX:
                    s = stem()
                    add(f"{s} {rng.choice(_SUFFIX[etype])}", etype, (s,))
                elif etype == "element":
                    name = stem().rstrip("aeiouy") + "ium"
                    while name in self.entities:  # two stems can share a consonant-final root
                        name = stem().rstrip("aeiouy") + "ium"
                    add(name, etype)
                else:
                    add(stem(), etype)
        for _ in range(_N_GENRES):  # values, not entities: never the subject of a question
            self.by_type.setdefault("genre", []).append(stem(1).lower() + rng.choice(("wave", "core", "step", "beat")))
        upper, lower = "ABCDEFGHIKLMNOPRSTVXZ", "abcdefghiklmnoprstuvxyz"
        symbols = sorted({a + b for a in upper for b in lower} - {w.capitalize() for w in _COMMON})
        if len(symbols) < len(self.by_type["element"]):  # a big world needs three-letter symbols
            symbols += sorted(a + b + c for a in upper for b in lower for c in lower)
        self.by_type["symbol"] = rng.sample(symbols, len(self.by_type["element"]))

    def _make_facts(self, rng: random.Random) -> None:
        t = self.by_type
        cities = list(t["city"])
        rng.shuffle(cities)
        # every country gets its capital, then every other city lands in a random country
        country_of = {c: t["country"][i] for i, c in enumerate(cities[:len(t["country"])])}
        for country, capital in zip(t["country"], cities):
            self.facts[("capital", country)] = capital
        for c in cities[len(t["country"]):]:
            country_of[c] = rng.choice(t["country"])
        for c in t["city"]:
            self.facts[("located_in", c)] = country_of[c]
        for p in t["person"]:
            self.facts[("born_in", p)] = rng.choice(t["city"])
            mentor = rng.choice(t["person"])
            while mentor == p:
                mentor = rng.choice(t["person"])
            self.facts[("mentor", p)] = mentor
        for e, sym in zip(t["element"], t["symbol"]):
            self.facts[("discovered_by", e)] = rng.choice(t["person"])
            self.facts[("symbol", e)] = sym
        for b in t["band"]:
            self.facts[("genre", b)] = rng.choice(t["genre"])
            self.facts[("formed_in", b)] = rng.choice(t["city"])
            self.facts[("leader", b)] = rng.choice(t["person"])
        for c in t["company"]:
            self.facts[("founder", c)] = rng.choice(t["person"])
            self.facts[("headquarters", c)] = rng.choice(t["city"])
        for team in t["team"]:
            self.facts[("home_city", team)] = rng.choice(t["city"])
            self.facts[("coach", team)] = rng.choice(t["person"])

    # ---- facts and splits ---------------------------------------------------------------

    def fact(self, relation: str, subject: str) -> Fact:
        """The fact `relation(subject)`; KeyError names both if there is none."""
        try:
            return Fact(relation, subject, self.facts[(relation, subject)])
        except KeyError:
            raise KeyError(f"SimWorld(seed={self.seed}): no fact {relation}({subject!r})") from None

    def all_facts(self, domain: str | None = None) -> list[Fact]:
        return [Fact(r, s, o) for (r, s), o in self.facts.items() if domain is None or RELATIONS[r].domain == domain]

    def split_of(self, fact: Fact) -> str:
        """'test' or 'train'; a seed-stable coin per fact, so the splits share no fact."""
        return "test" if stable_unit("split", self.seed, fact.key) < self.test_frac else "train"

    def chains(self) -> list[tuple[Fact, Fact]]:
        """Every two-hop chain (f1, f2) with f2.subject == f1.object that asks something new."""
        if self._chains is not None:
            return list(self._chains)
        out = []
        for f1 in self.all_facts():
            for r2 in RELATIONS.values():
                if r2.subj != RELATIONS[f1.relation].obj or (f1.relation, r2.name) in TRIVIAL_CHAINS:
                    continue
                f2 = self.fact(r2.name, f1.object)
                if f2.object != f1.subject:  # "the capital of the country of X" where X is that capital
                    out.append((f1, f2))
        self._chains = out
        return list(out)

    # ---- questions ----------------------------------------------------------------------

    def _split_pools(self, split: str) -> tuple[dict, dict]:
        """One-hop facts and two-hop chains of a split, grouped by relation (pair)."""
        if split not in self._pools:
            one: dict[str, list] = {}
            two: dict[tuple[str, str], list] = {}
            for f in self.all_facts():
                if self.split_of(f) == split:
                    one.setdefault(f.relation, []).append((f,))
            for f1, f2 in self.chains():
                if self.split_of(f1) == split and self.split_of(f2) == split:
                    two.setdefault((f1.relation, f2.relation), []).append((f1, f2))
            self._pools[split] = (one, two)
        return self._pools[split]

    def questions(self, n: int, seed: int = 0, split: str = "train", two_hop_frac: float = 0.4) -> list[SimQuestion]:
        """`n` distinct questions of `split`, balanced over relations (pairs), in shuffled order."""
        if split not in ("train", "test"):
            raise ValueError(f"SimWorld.questions: split must be 'train' or 'test', got {split!r}")
        if not 0.0 <= two_hop_frac <= 1.0:
            raise ValueError(f"SimWorld.questions: two_hop_frac must be in [0, 1], got {two_hop_frac}")
        rng = random.Random(stable_int("questions", self.seed, seed, split))
        n_two = round(n * two_hop_frac)
        one, two = self._split_pools(split)
        picked = self._sample(one, n - n_two, rng, "one-hop", split) + self._sample(two, n_two, rng, "two-hop", split)
        rng.shuffle(picked)
        return [self._question(facts, rng.randrange(2), split) for facts in picked]

    def _sample(self, groups: dict, k: int, rng: random.Random, what: str, split: str) -> list:
        have = sum(len(v) for v in groups.values())
        if k > have:
            raise ValueError(f"SimWorld(seed={self.seed}, n_entities_per_type={self.n}): {k} {what} "
                             f"{split} questions asked, only {have} exist; raise n_entities_per_type")
        # each group shuffled once, then drawn round-robin from a random group order
        queues = {g: rng.sample(v, len(v)) for g, v in sorted(groups.items())}
        out: list = []
        while len(out) < k:
            for g in rng.sample(sorted(queues), len(queues)):
                if queues[g] and len(out) < k:
                    out.append(queues[g].pop())
        return out

    def _question(self, facts: tuple[Fact, ...], variant: int, split: str) -> SimQuestion:
        rels = [RELATIONS[f.relation] for f in facts]
        hops = [Hop(r.ask(f.subject, variant), f.object, r.domain, r.name, f.subject) for r, f in zip(rels, facts)]
        if len(facts) == 1:
            text = hops[0].sub_question
        else:
            text = rels[1].ask(rels[0].phrase.format(s=facts[0].subject), variant)
        uid = f"sim{self.seed}-{split}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
        return SimQuestion(uid, text, [facts[-1].object], hops, ">".join(h.domain for h in hops), split)

    # ---- reading queries ----------------------------------------------------------------

    def find_entity(self, text: str) -> tuple[Entity, int, int] | None:
        """The longest entity name or alias in `text` (case-insensitive, whole words), with its span."""
        words = list(re.finditer(r"\w+", text))
        best = None
        for i in range(len(words)):
            for j in range(i + 1, min(i + self._max_words, len(words)) + 1):
                key = " ".join(w.group().lower() for w in words[i:j])
                ent = self._lookup.get(key)
                start, end = words[i].start(), words[j - 1].end()
                if ent is not None and (best is None or end - start > best[2] - best[1]):
                    best = (ent, start, end)
        return best

    def parse(self, text: str) -> Parse | None:
        """Entity and relation chain a query asks about; None if it names no entity."""
        found = self.find_entity(text)
        if found is None:
            return None
        ent, start, end = found
        rest = text[:start] + " " + text[end:]  # the name itself must not trigger keywords
        hit = {r.name for r in RELATIONS.values() if r.keywords.search(rest)}
        firsts = [r for r in RELATIONS.values() if r.subj == ent.type and r.name in hit]
        chains = [(r1, r2) for r1 in firsts for r2 in RELATIONS.values()
                  if r2.subj == r1.obj and r2.name in hit and (r1.name, r2.name) not in TRIVIAL_CHAINS]
        if len(chains) == 1:
            return Parse(ent, chains[0])
        if not chains and len(firsts) == 1:
            return Parse(ent, (firsts[0],))
        return Parse(ent, ())  # no relation, or more than one reading
