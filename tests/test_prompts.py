"""Router prompt: wording hooks, pool list, budget text, templates."""
from pathlib import Path

import pytest

from router_r1.pool.messages import SUBMODEL_SYSTEM, submodel_messages
from router_r1.pool.registry import ModelRegistry
from router_r1.prompts import (
    DEFAULT_TEMPLATE, TemplateError, budget_text, build_router_prompt, fill_template, load_template,
    pool_descriptors,
)
from router_r1.actions import ROUTE_EXAMPLE, parse_action

POOL = Path(__file__).resolve().parents[1] / "configs" / "pool" / "paper.yaml"


@pytest.fixture(scope="module")
def registry():
    return ModelRegistry.from_yaml(POOL)


def test_pool_descriptors_one_line_per_model(registry):
    lines = pool_descriptors(registry).splitlines()
    assert len(lines) == len(registry)
    for line, spec in zip(lines, registry.models.values()):
        assert spec.name in line and spec.descriptor in line
        assert f"${spec.price_out_per_m:.2f} per 1M output tokens" in line
    seen = pool_descriptors(registry.seen())
    assert "Palmyra-Creative-122B" not in seen and "Mixtral-8x22B-Instruct ($1.20" in seen


def test_default_prompt_content(registry):
    msgs = build_router_prompt("  Who wrote Hamlet?  ", registry.seen())
    assert [m["role"] for m in msgs] == ["user"]
    text = msgs[0]["content"]
    for needle in ("<think>", "</think>", ROUTE_EXAMPLE, "<information>", "<answer>", "</answer>", "cost"):
        assert needle.lower() in text.lower()
    assert pool_descriptors(registry.seen()) in text
    assert text.rstrip().endswith("Question: Who wrote Hamlet?")
    assert "at most" not in text and "{" not in text
    # the route example in the prompt is exactly what the parser calls a placeholder
    assert parse_action(ROUTE_EXAMPLE, registry).reason == "placeholder"


@pytest.mark.parametrize("budget,needle", [(3, "at most 3 times"), (1, "at most once"), (0, "may not consult")])
def test_turn_budget_text(registry, budget, needle):
    text = build_router_prompt("q?", registry, turn_budget=budget)[0]["content"]
    assert needle in text and budget_text(budget) in text


def test_bad_budget_and_question(registry):
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="turn_budget"):
            build_router_prompt("q?", registry, turn_budget=bad)
    with pytest.raises(ValueError, match="question"):
        build_router_prompt("   ", registry)


def test_substitution_is_format_safe(registry):
    template = 'Reply as JSON {"answer": ...}.\nPool:\n{pool}\n{budget}Q: {question}'
    text = build_router_prompt("What is {pool} in {x}?", registry, template=template, turn_budget=2)[0]["content"]
    assert text.startswith('Reply as JSON {"answer": ...}.')
    assert text.endswith("Q: What is {pool} in {x}?")  # the question is not re-substituted
    assert text.count(pool_descriptors(registry)) == 1 and "at most 2 times" in text
    assert fill_template("{question} {unknown}", question="a") == "a {unknown}"


def test_template_without_budget_refuses_a_budget(registry):
    assert "Q: q?" in build_router_prompt("q?", registry, template="Q: {question}")[0]["content"]
    with pytest.raises(TemplateError, match="budget"):
        build_router_prompt("q?", registry, template="Q: {question}", turn_budget=2)


def test_load_template(tmp_path, registry):
    good = tmp_path / "good.txt"
    good.write_text("Models:\n{pool}\nQuestion: {question}\n")
    template = load_template(good)
    assert build_router_prompt("Who?", registry, template=template)[0]["content"].endswith("Question: Who?\n")
    bad = tmp_path / "bad.txt"
    bad.write_text("Models: {pool}")
    with pytest.raises(TemplateError, match="bad.txt.*question"):
        load_template(bad)
    with pytest.raises(TemplateError, match="missing.txt"):
        load_template(tmp_path / "missing.txt")
    with pytest.raises(TemplateError, match="question"):
        build_router_prompt("Who?", registry, template="no placeholder")


def test_default_template_has_all_placeholders():
    assert all(f"{{{p}}}" in DEFAULT_TEMPLATE for p in ("question", "pool", "budget"))


def test_submodel_messages_unchanged():
    assert submodel_messages("  Who wrote Hamlet? \n") == [
        {"role": "system", "content": SUBMODEL_SYSTEM},
        {"role": "user", "content": "Who wrote Hamlet?"},
    ]
