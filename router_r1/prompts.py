"""Prompt text: the router's instructions, pool descriptors, budget text (the sub-model's prompt is the pool
client's, router_r1/pool/messages.py).

All wording here is ours. A user who needs another template (for example the exact
prompt a published checkpoint was trained with) loads it from a file instead.
"""
from __future__ import annotations

import re
from pathlib import Path

from router_r1.pool import listing
from router_r1.pool.registry import ModelRegistry
from router_r1.actions import ROUTE_EXAMPLE, wrap_information

# Placeholders a template may use; {question} is required. One listing placeholder per style
# (router_r1/pool/listing.py: {pool} descriptors, {pool_domains}, {pool_card}), filled from the pool in use.
PLACEHOLDERS = ("question", *listing.LISTINGS.values(), "budget", "alpha")
PLACEHOLDER_RE = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")

DEFAULT_TEMPLATE = (
    "Answer the question at the end. You work as a router: you reason on your own and "
    "may consult the language models listed below.\n\n"
    "How to work:\n"
    "- Put your reasoning inside <think> and </think> every time before you act.\n"
    f"- To consult a model, write {ROUTE_EXAMPLE}, with a name from the list and one short, "
    "self-contained question. Its reply will be shown to you between <information> and "
    "</information>. Ask one model one thing at a time.\n"
    "- When you are ready, give the final answer inside <answer> and </answer>: only the "
    "answer itself (a name, a date, a number or a few words), no explanation.\n\n"
    "Cost: every consultation is paid for, in proportion to the model's price and the "
    "length of its reply. Consult only when it helps, prefer a cheaper model that is "
    "likely to know, and answer without consulting when you are sure.\n\n"
    "{alpha}{budget}"
    "Models:\n{pool}\n\n"
    "Question: {question}\n"
)

# Control text for a route refused at the turn budget (the forced answer). No tags inside:
# it is shown in an <information> block, and tags there would read as nested ones.
BUDGET_EXHAUSTED_TEXT = "No consultations are left. Give your final answer now."


class TemplateError(ValueError):
    """A prompt template that cannot be used; the message names its source."""


def pool_descriptors(registry: ModelRegistry) -> str:
    """One line per model: name, price per 1M output tokens, descriptor (registry order)."""
    return listing.render("descriptors", registry)


def budget_text(turn_budget: int | None) -> str:
    """The turn-budget sentence (with its paragraph break), or "" without a budget."""
    if turn_budget is None:
        return ""
    if isinstance(turn_budget, bool) or not isinstance(turn_budget, int) or turn_budget < 0:
        raise ValueError(f"turn_budget must be an integer >= 0 or None, got {turn_budget!r}")
    if turn_budget == 0:
        return "For this question you may not consult any model: answer on your own.\n\n"
    times = "once" if turn_budget == 1 else f"{turn_budget} times"
    return f"You may consult the models at most {times} for this question; then you must answer.\n\n"


def alpha_text(alpha: float | None) -> str:
    """The cost-preference sentence of an alpha-conditioned prompt (with its paragraph break), or ""."""
    if alpha is None:
        return ""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be a number in [0, 1] or None, got {alpha!r}")
    return f"Cost weight for this question: {float(alpha):g} (0: only a right answer counts; 1: cost counts most).\n\n"


def budget_exhausted_message() -> str:
    """The environment's reply to a refused route: an <information> block the policy must answer after."""
    return wrap_information(BUDGET_EXHAUSTED_TEXT)


def _check_template(template: str, source: str) -> None:
    if "{question}" not in template:
        raise TemplateError(f"{source}: template has no {{question}} placeholder")


def load_template(path: str | Path) -> str:
    """Read a prompt template from a user file; it must contain {question}."""
    path = Path(path)
    if not path.is_file():
        raise TemplateError(f"{path}: template file not found")
    try:
        template = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TemplateError(f"{path}: template is not utf-8 text") from e
    _check_template(template, str(path))
    return template


def fill_template(template: str, **values: str) -> str:
    """Substitute the PLACEHOLDERS in one pass; other braces are left alone.

    Unlike str.format, braces in the template or in the values (JSON, LaTeX, a question
    that mentions "{pool}") are never interpreted.
    """
    return PLACEHOLDER_RE.sub(lambda m: values.get(m.group(1), m.group(0)), template)


def with_pool(template: str, registry: ModelRegistry) -> str:
    """`template` with its listing placeholder filled from `registry`, the other placeholders kept: the text a
    prompt built from it shows besides the question, budget and alpha."""
    return fill_template(template, **{listing.LISTINGS[s]: listing.render(s, registry)
                                      for s in listing.styles_in(template)})


def build_router_prompt(
    question: str,
    registry: ModelRegistry,
    template: str | None = None,
    turn_budget: int | None = None,
    alpha: float | None = None,
) -> list[dict[str, str]]:
    """The router's chat messages: a single user message with instructions, pool and question.

    The template's listing placeholder is filled from `registry` in its style; a template without one lists the
    models written into it. `alpha` (alpha-conditioned routers) states the cost weight: at {alpha}, or, in a
    template without it (one written before conditioning existed), just before the budget sentence at {budget}.
    """
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"build_router_prompt: question must be a non-empty string, got {question!r}")
    template = DEFAULT_TEMPLATE if template is None else template
    _check_template(template, "build_router_prompt")
    if turn_budget is not None and "{budget}" not in template:
        raise TemplateError("build_router_prompt: turn_budget given but the template has no {budget} placeholder")
    if alpha is not None and "{alpha}" not in template and "{budget}" not in template:
        raise TemplateError("build_router_prompt: alpha given but the template has neither {alpha} nor {budget}")
    budget, cost = budget_text(turn_budget), alpha_text(alpha)
    if "{alpha}" not in template:
        budget, cost = cost + budget, ""
    pools = {listing.LISTINGS[style]: listing.render(style, registry) for style in listing.styles_in(template)}
    content = fill_template(template, question=question.strip(), budget=budget, alpha=cost, **pools)
    return [{"role": "user", "content": content}]
