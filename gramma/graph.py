"""The knowledge-graph store: entities, directed triples, optional image descriptions per edge.

A graph lives in a directory as two files, JSONL or parquet (one record per line/row):

    entities.{jsonl,parquet}  {id, name, aliases: [str], type, details}
    triples.{jsonl,parquet}   {head, relation, tail, images: [{objects, attributes, relations, caption}]}

`head`/`tail` are entity ids; `images` may be missing or empty. A bad record raises
GraphError naming the file, the row and the field.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path


class GraphError(ValueError):
    """A graph file or record that cannot be used; the message names the file, row and field."""


@dataclass
class Entity:
    id: str
    name: str
    type: str = "thing"
    aliases: list[str] = field(default_factory=list)
    details: str = ""


@dataclass
class ImageDesc:
    """A scene-graph-like description of one image attached to an edge."""
    objects: list[str] = field(default_factory=list)
    attributes: list[str] = field(default_factory=list)
    relations: list[str] = field(default_factory=list)
    caption: str = ""

    def text(self) -> str:
        parts = [self.caption.strip()] if self.caption.strip() else []
        for name, items in (("objects", self.objects), ("attributes", self.attributes),
                            ("relations", self.relations)):
            if items:
                parts.append(f"{name}: {', '.join(items)}")
        return "; ".join(parts)


@dataclass
class Triple:
    head: str
    relation: str
    tail: str
    images: list[ImageDesc] = field(default_factory=list)


@dataclass
class Edge:
    """A triple seen from one of its ends: `outgoing` means node --relation--> other."""
    node: str
    relation: str
    other: str
    outgoing: bool
    triple: Triple

    def arrow(self) -> str:
        return f"-{self.relation}->" if self.outgoing else f"<-{self.relation}-"


def norm_name(s: str) -> str:
    """Case- and space-insensitive form used for name lookups."""
    return " ".join(re.sub(r"[^\w\s]", " ", s.lower()).split())


class KnowledgeGraph:
    def __init__(self, entities: list[Entity], triples: list[Triple], source: str = "<memory>"):
        self.source = source
        self.entities: dict[str, Entity] = {}
        for e in entities:
            if e.id in self.entities:
                raise GraphError(f"{source}: entity id {e.id!r} appears twice")
            self.entities[e.id] = e
        self.triples = triples
        self._out: dict[str, list[Triple]] = defaultdict(list)
        self._in: dict[str, list[Triple]] = defaultdict(list)
        for i, t in enumerate(triples):
            for end in ("head", "tail"):
                if getattr(t, end) not in self.entities:
                    raise GraphError(f"{source}: triples row {i}: field {end!r} names unknown entity {getattr(t, end)!r}")
            self._out[t.head].append(t)
            self._in[t.tail].append(t)
        self._by_name: dict[str, list[str]] = defaultdict(list)
        for e in self.entities.values():
            for n in dict.fromkeys(norm_name(x) for x in [e.name, *e.aliases]):
                self._by_name[n].append(e.id)

    # ------------------------------------------------------------------ queries
    def name(self, eid: str) -> str:
        return self.entities[eid].name

    def edges(self, node: str) -> list[Edge]:
        """Every edge touching `node`, outgoing first, each with its true direction."""
        out = [Edge(node, t.relation, t.tail, True, t) for t in self._out.get(node, [])]
        inc = [Edge(node, t.relation, t.head, False, t) for t in self._in.get(node, [])]
        return out + inc

    def neighbours(self, node: str) -> dict[str, list[Edge]]:
        """Edges of `node` grouped by the entity at the other end (insertion order kept)."""
        groups: dict[str, list[Edge]] = {}
        for e in self.edges(node):
            if e.other != node:
                groups.setdefault(e.other, []).append(e)
        return groups

    def edges_between(self, a: str, b: str) -> list[Edge]:
        """Edges between a and b in either direction, seen from a."""
        return [e for e in self.edges(a) if e.other == b]

    def degree(self, node: str) -> int:
        return len(self._out.get(node, [])) + len(self._in.get(node, []))

    def lookup(self, name: str) -> list[str]:
        """Entity ids whose name or alias matches `name` (normalised); may be several."""
        return list(self._by_name.get(norm_name(name), []))

    # ------------------------------------------------------------------ files
    def save(self, out_dir: str | Path) -> None:
        """Write entities.jsonl and triples.jsonl."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "entities.jsonl", "w") as f:
            for e in self.entities.values():
                f.write(json.dumps(asdict(e)) + "\n")
        with open(out / "triples.jsonl", "w") as f:
            for t in self.triples:
                rec = asdict(t)
                if not t.images:
                    rec.pop("images")
                f.write(json.dumps(rec) + "\n")

    @classmethod
    def load(cls, graph_dir: str | Path) -> "KnowledgeGraph":
        """Load entities.{jsonl,parquet} and triples.{jsonl,parquet} from a directory."""
        d = Path(graph_dir)
        ents = [_entity(r, f"{path}: row {i}") for path, i, r in _records(d, "entities")]
        trips = [_triple(r, f"{path}: row {i}") for path, i, r in _records(d, "triples")]
        return cls(ents, trips, source=str(d))


# ---------------------------------------------------------------------------- record checks

def _records(d: Path, stem: str):
    for suffix in (".jsonl", ".parquet"):
        path = d / f"{stem}{suffix}"
        if path.is_file():
            break
    else:
        raise GraphError(f"{d}: no {stem}.jsonl or {stem}.parquet")
    if suffix == ".jsonl":
        for i, line in enumerate(path.read_text().splitlines()):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise GraphError(f"{path}: row {i}: not JSON ({e})") from e
            if not isinstance(rec, dict):
                raise GraphError(f"{path}: row {i}: must be a JSON object")
            yield path, i, rec
        return
    import pandas as pd

    from verl.trainer.dataset import to_python

    try:
        frame = pd.read_parquet(path)
    except Exception as e:  # pyarrow raises several types for a bad file
        raise GraphError(f"{path}: cannot read as parquet ({e})") from e
    for i, rec in enumerate(frame.to_dict("records")):
        yield path, i, {k: to_python(v) for k, v in rec.items() if v is not None}


def _str(rec: dict, key: str, where: str, default: str | None = None) -> str:
    v = rec.get(key, default)
    if not isinstance(v, str) or (default is None and not v.strip()):
        raise GraphError(f"{where}: field {key!r} must be a non-empty string, got {v!r:.60}")
    return v


def _strs(rec: dict, key: str, where: str) -> list[str]:
    v = rec.get(key) or []
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise GraphError(f"{where}: field {key!r} must be a list of strings, got {v!r:.60}")
    return v


def _entity(rec: dict, where: str) -> Entity:
    return Entity(id=_str(rec, "id", where), name=_str(rec, "name", where), type=_str(rec, "type", where, "thing"),
                  aliases=_strs(rec, "aliases", where), details=_str(rec, "details", where, ""))


def _triple(rec: dict, where: str) -> Triple:
    images = rec.get("images") or []
    if not isinstance(images, list) or not all(isinstance(x, dict) for x in images):
        raise GraphError(f"{where}: field 'images' must be a list of objects")
    descs = [ImageDesc(objects=_strs(m, "objects", f"{where}: images[{j}]"),
                       attributes=_strs(m, "attributes", f"{where}: images[{j}]"),
                       relations=_strs(m, "relations", f"{where}: images[{j}]"),
                       caption=_str(m, "caption", f"{where}: images[{j}]", "")) for j, m in enumerate(images)]
    return Triple(head=_str(rec, "head", where), relation=_str(rec, "relation", where),
                  tail=_str(rec, "tail", where), images=descs)
