"""Action parsing (our tag format) and safe resolution of targets by number or name."""
import pytest

from gramma.actions import parse_action, render, render_stop, resolve
from gramma.graph import Entity, KnowledgeGraph, Triple


@pytest.mark.parametrize("text, kind, arg", [
    ("<think>go</think><action>EXPAND(3)</action>", "expand", "3"),
    ("<action>expand( Ana Kor )</action>", "expand", "Ana Kor"),
    ("  <action>FOCUS([2])</action>\n", "focus", "[2]"),
    ("<think>look\nclosely</think> <action>CROSS_MODAL(Bo Tan)</action>", "cross_modal", "Bo Tan"),
])
def test_parse_target_actions(text, kind, arg):
    a = parse_action(text)
    assert (a.kind, a.arg, a.well_formed) == (kind, arg, True)


def test_parse_stop_with_and_without_evidence():
    a = parse_action("<action>STOP(Paris | Ana Kor > Lyon >  Paris)</action>")
    assert (a.kind, a.answer, a.evidence) == ("stop", "Paris", ["Ana Kor", "Lyon", "Paris"])
    a = parse_action("<action>STOP(New York (city))</action>")  # parentheses inside the answer survive
    assert (a.answer, a.evidence) == ("New York (city)", [])
    assert parse_action(render_stop("Lyon", ["Ana Kor", "Lyon"], think="t")).evidence == ["Ana Kor", "Lyon"]


@pytest.mark.parametrize("text, why", [
    ("EXPAND(3)", "no complete action block"),
    ("<action>EXPAND(3)", "no complete action block"),
    ("<action>EXPAND(3)</action> and more", "text outside"),
    ("hello <action>EXPAND(3)</action>", "text outside"),
    ("<action>JUMP(3)</action>", "unknown action JUMP"),
    ("<action>EXPAND 3</action>", "VERB(argument)"),
    ("<action>EXPAND()</action>", "needs an argument"),
    ("<action>STOP( | a > b)</action>", "needs an answer"),
])
def test_malformed_turns_are_invalid_not_exceptions(text, why):
    a = parse_action(text)
    assert a.kind == "invalid" and not a.well_formed and why in a.reason


def test_render_refuses_unknown_verbs():
    assert render("FOCUS", "2") == "<action>FOCUS(2)</action>"
    with pytest.raises(ValueError, match="unknown verb"):
        render("JUMP", "2")


@pytest.fixture()
def graph():
    ents = [Entity("a", "Ana Kor"), Entity("b", "Lyon", aliases=["Lyon City"]), Entity("c", "Lyon"),
            Entity("d", "Bo Tan")]
    return KnowledgeGraph(ents, [Triple("a", "born_in", "b"), Triple("a", "likes", "c")])


def test_resolve_by_number_and_name(graph):
    cands, known = ["b", "c"], {"a", "b", "c"}
    assert resolve("2", cands, known, graph) == ("c", "")
    assert resolve("[1]", cands, known, graph) == ("b", "")
    assert resolve("lyon city", cands, known, graph) == ("b", "")
    assert resolve("ANA KOR", cands, known, graph) == ("a", "")


@pytest.mark.parametrize("ref, why", [
    ("3", "no candidate [3] in the latest list (1-2)"),
    ("0", "no candidate [0]"),
    ("Paris", "unknown entity 'Paris'"),
    ("Bo Tan", "not in view yet"),
    ("Lyon", "ambiguous (2 entities)"),
])
def test_resolve_failures_give_reasons(graph, ref, why):
    target, reason = resolve(ref, ["b", "c"], {"a", "b", "c"}, graph)
    assert target is None and why in reason


def test_resolve_number_before_any_list(graph):
    assert resolve("1", [], {"a"}, graph) == (None, "no candidate [1] in the latest list (none listed yet)")
