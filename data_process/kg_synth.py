"""A seeded synthetic knowledge graph with one-hop, two-hop and visual questions (GraMMA's data).

    python -m data_process.kg_synth --out-dir outputs/gramma/data

Writes OUT/graph/{entities,triples}.jsonl and OUT/{train,val,test}.parquet in the engine's
row format (prompt, reward_model.ground_truth, extra_info.uid). Questions are split by
their start person, so no test question starts where a train question does.

Graph: countries, cities (located_in country), companies (headquartered_in city), teams
(based_in city), persons (born_in city, works_for company, plays_for team, friend_of person).
Some friend_of edges carry image descriptions ("Ulo Remi wearing a red hat"); a visual
question asks which friend is shown with an item, and only one friend's edge shows it.
"""
from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from pathlib import Path

from data_process.schema import make_row, validate_row
from gramma.graph import Entity, ImageDesc, KnowledgeGraph, Triple
from gramma.prompt import build_messages
from router_r1.flags import from_args, parser_for, run_command

_ONSET = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "tr"]
_VOWEL = ["a", "e", "i", "o", "u", "ai", "ou"]
_CODA = ["", "", "n", "r", "s", "l", "m"]
PREFIX = {"country": "n", "city": "c", "company": "co", "team": "t", "person": "p"}
COLORS = ["red", "blue", "green", "yellow", "black", "white"]
ITEMS = ["hat", "scarf", "guitar", "bicycle", "umbrella", "camera", "backpack"]
SCENES = ["at a market", "in a park", "on a bridge", "at a concert", "by the sea", "in a cafe"]
# (relations on the path, question template); {x} is the start entity's name.
TEMPLATES = {
    "kg_1hop": [(("born_in",), "In which city was {x} born?"),
                (("works_for",), "Which company does {x} work for?"),
                (("plays_for",), "Which team does {x} play for?")],
    "kg_2hop": [(("born_in", "located_in"), "In which country was {x} born?"),
                (("works_for", "headquartered_in"), "In which city is the company {x} works for based?"),
                (("plays_for", "based_in"), "In which city does the team of {x} play?")],
}


@dataclass
class SynthConfig:
    """The graph's and the questions' settings; each field is a flag of `python -m data_process.kg_synth`."""

    out_dir: str = "outputs/gramma/data"  # where the graph and the question parquets are written
    seed: int = 0  # seed of the names and edges
    countries: int = 10  # countries in the graph
    cities: int = 30  # cities
    companies: int = 20  # companies
    teams: int = 10  # teams
    persons: int = 240  # persons
    friends: int = 3  # outgoing friend_of edges per person
    image_prob: float = 0.7  # share of friend_of edges with an image description
    val_frac: float = 0.15  # share of questions in the validation split
    test_frac: float = 0.2  # share in the test split


class Namer:
    """Unique pronounceable names from syllables."""

    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set()

    def word(self, syllables: int = 2) -> str:
        while True:
            w = "".join(self.rng.choice(_ONSET) + self.rng.choice(_VOWEL) + self.rng.choice(_CODA)
                        for _ in range(syllables)).capitalize()
            if w not in self.used and len(w) <= 9:
                self.used.add(w)
                return w


def build_graph(cfg: SynthConfig) -> KnowledgeGraph:
    """The synthetic graph of `cfg` (same seed, same graph)."""
    rng = random.Random(cfg.seed)
    namer = Namer(rng)
    ents: list[Entity] = []
    triples: list[Triple] = []

    def add(kind: str, n: int, make_name) -> list[str]:
        ids = []
        for i in range(n):
            eid = f"{PREFIX[kind]}{i}"
            ents.append(Entity(eid, make_name(), kind))
            ids.append(eid)
        return ids

    countries = add("country", cfg.countries, lambda: namer.word(2) + "ia")
    cities = add("city", cfg.cities, lambda: namer.word(2))
    companies = add("company", cfg.companies, lambda: f"{namer.word(2)} {rng.choice(['Corp', 'Labs', 'Works'])}")
    teams = add("team", cfg.teams, lambda: f"{namer.word(2)} {rng.choice(['Rovers', 'United', 'Stars'])}")
    persons = add("person", cfg.persons, lambda: f"{namer.word(1)} {namer.word(2)}")
    by_id = {e.id: e for e in ents}
    for c in cities:
        triples.append(Triple(c, "located_in", rng.choice(countries)))
        by_id[c].aliases = [f"{by_id[c].name} City"]
    for co in companies:
        triples.append(Triple(co, "headquartered_in", rng.choice(cities)))
    for t in teams:
        triples.append(Triple(t, "based_in", rng.choice(cities)))
    for p in persons:
        triples.append(Triple(p, "born_in", rng.choice(cities)))
        triples.append(Triple(p, "works_for", rng.choice(companies)))
        if rng.random() < 0.5:
            triples.append(Triple(p, "plays_for", rng.choice(teams)))
        for f in rng.sample([q for q in persons if q != p], cfg.friends):
            images = []
            if rng.random() < cfg.image_prob:
                color, item, scene = rng.choice(COLORS), rng.choice(ITEMS), rng.choice(SCENES)
                name, other = by_id[f].name, by_id[p].name
                images.append(ImageDesc(objects=["person", "person", item],
                                        attributes=[f"{color} {item}"],
                                        relations=[f"{name} with {color} {item}", f"{name} next to {other}"],
                                        caption=f"{name} and {other} {scene}"))
            triples.append(Triple(p, "friend_of", f, images))
    for e in ents:
        e.details = _details(e, triples)
    return KnowledgeGraph(ents, triples, source=f"synthetic(seed={cfg.seed})")


def _details(e: Entity, triples: list[Triple]) -> str:
    n = sum(e.id in (t.head, t.tail) for t in triples)
    return f"{e.name} is a {e.type} with {n} links in the graph."


@dataclass
class Question:
    kind: str  # kg_1hop | kg_2hop | kg_visual
    text: str
    start: str  # entity id
    answer: str  # entity id
    path: list[str]  # entity ids from start to answer
    relations: list[str]
    visual: str = ""  # the attribute the visual question asks about ("red hat")


def questions_for(g: KnowledgeGraph, person: str) -> list[Question]:
    """Every question the graph supports for one start person (unique answers only)."""
    out = []
    name = g.name(person)
    for kind, templates in TEMPLATES.items():
        for rels, text in templates:
            path = _follow(g, person, rels)
            if path:
                out.append(Question(kind, text.format(x=name), person, path[-1], path, list(rels)))
    friends = [e for e in g.edges(person) if e.outgoing and e.relation == "friend_of"]
    shown: dict[str, list[str]] = {}
    for e in friends:
        for img in e.triple.images:
            for a in img.attributes:
                shown.setdefault(a, []).append(e.other)
    for attr, who in sorted(shown.items()):
        if len(set(who)) == 1 and len(friends) > 1:  # exactly one friend shows it: a visual check decides
            out.append(Question("kg_visual", f"Which friend of {name} is shown with a {attr}?", person, who[0],
                                [person, who[0]], ["friend_of"], attr))
            break  # one visual question per person
    return out


def _follow(g: KnowledgeGraph, start: str, rels: tuple[str, ...]) -> list[str] | None:
    path = [start]
    for r in rels:
        nxt = [e.other for e in g.edges(path[-1]) if e.outgoing and e.relation == r]
        if len(nxt) != 1:
            return None
        path.append(nxt[0])
    return path


def question_row(g: KnowledgeGraph, q: Question, split: str, index: int, advice: list[str] | None = None) -> dict:
    """One parquet row in the engine's format, with the gold path for the reward and the oracle."""
    answer = g.entities[q.answer]
    row = make_row(q.kind, split, index, q.text, [answer.name, *answer.aliases],
                   build_messages(q.text, g.name(q.start), advice), "synthetic", f"{q.start}:{q.kind}")
    row["reward_model"]["ground_truth"].update(path=list(q.path), relations=list(q.relations), visual=q.visual)
    row["extra_info"].update(start=q.start, start_name=g.name(q.start))
    validate_row(row, f"{split}.parquet: {q.kind} row {index}")
    return row


def split_persons(g: KnowledgeGraph, cfg: SynthConfig) -> dict[str, list[str]]:
    persons = sorted((e for e in g.entities if g.entities[e].type == "person"), key=lambda x: int(x[len(PREFIX["person"]):]))
    rng = random.Random(cfg.seed + 1)
    rng.shuffle(persons)
    n_test, n_val = round(len(persons) * cfg.test_frac), round(len(persons) * cfg.val_frac)
    return {"test": persons[:n_test], "val": persons[n_test:n_test + n_val], "train": persons[n_test + n_val:]}


def build(cfg: SynthConfig) -> dict[str, int]:
    """Write the graph and the three parquet files; returns file -> rows."""
    import pandas as pd

    out = Path(cfg.out_dir)
    g = build_graph(cfg)
    g.save(out / "graph")
    written = {"graph/entities.jsonl": len(g.entities), "graph/triples.jsonl": len(g.triples)}
    for split, persons in split_persons(g, cfg).items():
        counts: dict[str, int] = {}
        rows = []
        for p in persons:
            for q in questions_for(g, p):
                counts[q.kind] = counts.get(q.kind, -1) + 1
                rows.append(question_row(g, q, split, counts[q.kind]))
        pd.DataFrame(rows).to_parquet(out / f"{split}.parquet", index=False)
        written[f"{split}.parquet"] = len(rows)
    return written


def parse_args(argv: list[str] | None = None) -> SynthConfig:
    p = parser_for(SynthConfig, "python -m data_process.kg_synth", __doc__.split("\n\n")[0])
    return from_args(SynthConfig, p.parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)

    def report(written: dict[str, int]) -> None:
        for path, n in written.items():
            print(f"wrote {Path(cfg.out_dir) / path}: {n} rows")

    return run_command(lambda: build(cfg), (ValueError,), report)


if __name__ == "__main__":
    sys.exit(main())
