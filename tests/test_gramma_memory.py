"""Exploration memory (true edge direction, evidence, visual findings) and context compression."""
import pytest

from gramma.graph import Entity, ImageDesc, KnowledgeGraph, Triple
from gramma.memory import Memory, compress


def graph():
    ents = [Entity("a", "Ana"), Entity("b", "Lyon"), Entity("c", "Bo"), Entity("d", "Remote")]
    trips = [Triple("a", "born_in", "b"), Triple("c", "friend_of", "a", [ImageDesc([], ["red hat"], [], "Bo")])]
    return KnowledgeGraph(ents, trips)


def test_moves_record_the_true_edge_direction():
    g, m = graph(), Memory("a")
    m.move(g, "a")  # expanding where we stand is not a move
    m.move(g, "c")  # along c -friend_of-> a, walked backwards
    m.move(g, "a")
    m.move(g, "b")
    assert m.moves == ["Ana <-friend_of- Bo", "Bo -friend_of-> Ana", "Ana -born_in-> Lyon"]
    assert m.evidence == [("c", "friend_of", "a"), ("a", "born_in", "b")]  # as stored in the graph, deduplicated
    assert m.visited == ["a", "c", "b"] and m.current == "b"
    m.move(g, "d")  # not a neighbour: recorded as a jump, no evidence
    assert m.moves[-1] == "Lyon ... Remote" and len(m.evidence) == 2


def test_visual_findings_and_summary():
    g, m = graph(), Memory("a")
    m.move(g, "a")
    m.add_visual(g, g.edges_between("a", "c"))
    m.focused.append("b")
    s = m.summary(g)
    assert "At Ana" in s and "Bo: red hat (Ana <-friend_of- Bo)" in s and "Read details of Lyon" in s
    assert m.evidence == [("c", "friend_of", "a")]


def test_see_makes_candidates_known():
    m = Memory("a")
    m.see(["b", "c"])
    assert m.candidates == ["b", "c"] and m.known == {"a", "b", "c"}


def test_compress_keeps_prompt_and_summary_and_the_newest_turns():
    prompt, summary = [1] * 10, [2] * 5
    turns = [[3] * 4, [4] * 4, [5] * 4]
    ids, dropped = compress(prompt, summary, turns, budget=24)
    assert ids == prompt + summary + [4] * 4 + [5] * 4 and dropped == 1
    ids, dropped = compress(prompt, summary, turns, budget=15)
    assert ids == prompt + summary and dropped == 3
    ids, dropped = compress(prompt, summary, turns, budget=100)
    assert ids == prompt + summary + [3] * 4 + [4] * 4 + [5] * 4 and dropped == 0
    with pytest.raises(ValueError, match="below prompt"):
        compress(prompt, summary, turns, budget=14)
