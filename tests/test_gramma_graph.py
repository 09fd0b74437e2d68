"""The knowledge-graph store: loading (JSONL and parquet), errors that name file/row/field, directed queries."""
import json
from pathlib import Path

import pandas as pd
import pytest

from gramma.graph import Entity, GraphError, ImageDesc, KnowledgeGraph, Triple

KG = Path(__file__).resolve().parent / "data" / "kg"


def small():
    ents = [Entity("a", "Ana Kor", "person"), Entity("b", "Lyon", "city", aliases=["Lyon City"]),
            Entity("c", "Bo Tan", "person"), Entity("d", "Lyon", "team")]
    trips = [Triple("a", "born_in", "b"), Triple("c", "friend_of", "a", [ImageDesc(["hat"], ["red hat"], [], "x")]),
             Triple("a", "friend_of", "c"), Triple("d", "based_in", "b")]
    return KnowledgeGraph(ents, trips)


def test_shipped_tiny_graph_loads_and_is_small():
    g = KnowledgeGraph.load(KG)
    assert len(g.entities) >= 20 and len(g.triples) >= 40
    assert sum((KG / f).stat().st_size for f in ("entities.jsonl", "triples.jsonl")) < 16_000
    assert any(t.images for t in g.triples) and {"person", "city", "country"} <= {e.type for e in g.entities.values()}


def test_neighbours_keep_direction_and_group_by_target():
    g = small()
    groups = g.neighbours("a")
    assert list(groups) == ["b", "c"]
    arrows = sorted(e.arrow() for e in groups["c"])  # a -friend_of-> c and c -friend_of-> a: both kept
    assert arrows == ["-friend_of->", "<-friend_of-"]
    (born,) = groups["b"]
    assert born.outgoing and born.triple.head == "a"
    (back,) = g.edges_between("b", "a")
    assert not back.outgoing and back.arrow() == "<-born_in-"
    assert g.degree("a") == 3


def test_lookup_by_name_or_alias_may_be_ambiguous():
    g = small()
    assert g.lookup("ana  KOR") == ["a"]
    assert g.lookup("lyon city") == ["b"]
    assert sorted(g.lookup("Lyon")) == ["b", "d"]
    assert g.lookup("Paris") == []


def test_save_then_load_jsonl_and_parquet_roundtrip(tmp_path):
    g = small()
    g.save(tmp_path / "j")
    back = KnowledgeGraph.load(tmp_path / "j")
    assert back.entities == g.entities and back.triples == g.triples
    (tmp_path / "p").mkdir()
    for stem in ("entities", "triples"):
        rows = [json.loads(x) for x in (tmp_path / "j" / f"{stem}.jsonl").read_text().splitlines()]
        pd.DataFrame(rows).to_parquet(tmp_path / "p" / f"{stem}.parquet")
    back = KnowledgeGraph.load(tmp_path / "p")
    assert back.entities == g.entities and back.triples[1].images == g.triples[1].images


@pytest.mark.parametrize("entities, triples, needle", [
    ('{"id": "a", "name": "A"}\n{"id": "b"}\n', '', "entities.jsonl: row 1: field 'name'"),
    ('{"id": "a", "name": "A"}\nnot json\n', '', "entities.jsonl: row 1: not JSON"),
    ('{"id": "a", "name": "A", "aliases": "A2"}\n', '', "row 0: field 'aliases'"),
    ('{"id": "a", "name": "A"}\n', '{"head": "a", "relation": "r"}\n', "triples.jsonl: row 0: field 'tail'"),
    ('{"id": "a", "name": "A"}\n', '{"head": "a", "relation": "r", "tail": "zz"}\n', "unknown entity 'zz'"),
    ('{"id": "a", "name": "A"}\n', '{"head": "a", "relation": "r", "tail": "a", "images": [{"objects": 3}]}\n',
     "row 0: images[0]: field 'objects'"),
    ('{"id": "a", "name": "A"}\n{"id": "a", "name": "B"}\n', '', "entity id 'a' appears twice"),
])
def test_bad_records_name_file_row_and_field(tmp_path, entities, triples, needle):
    (tmp_path / "entities.jsonl").write_text(entities)
    (tmp_path / "triples.jsonl").write_text(triples)
    with pytest.raises(GraphError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        KnowledgeGraph.load(tmp_path)


def test_missing_files_are_named(tmp_path):
    with pytest.raises(GraphError, match="no entities.jsonl or entities.parquet"):
        KnowledgeGraph.load(tmp_path)
