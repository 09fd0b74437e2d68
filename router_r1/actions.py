"""The routing protocol: tags, first-action truncation, action parsing, observations.

A policy turn is `<think>...</think>` followed by one action:
    <search>Model-Name: sub-question</search>   route a sub-question to a pool model
    <answer>...</answer>                         finish the episode
The environment answers a route with `<information>...</information>`.
Tags are matched exactly (lower case, no spaces), as the policy is prompted to write them.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Callable, Literal

from router_r1.pool.messages import clean_text
from router_r1.pool.registry import ModelRegistry

TAGS = ("think", "search", "answer", "information")
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"
STOP_STRINGS = (SEARCH_CLOSE, ANSWER_CLOSE)  # generation stops after either

# The route example the prompt shows; a policy that copies it made no real choice.
PLACEHOLDER_MODEL, PLACEHOLDER_QUERY = "Model-Name", "sub-question"
ROUTE_EXAMPLE = f"{SEARCH_OPEN}{PLACEHOLDER_MODEL}: {PLACEHOLDER_QUERY}{SEARCH_CLOSE}"

NO_REPLY_TEXT = "The model did not answer."  # observation for a failed pool call

INVALID_REASONS = ("placeholder", "no_colon", "empty_model", "empty_query", "unknown_model", "nested_or_unclosed")

_ANY_TAG = re.compile(r"</?(?:think|search|answer|information)>")
# Pool text may spell our tags loosely; all variants are made inert.
_LOOSE_TAG = re.compile(r"<\s*(/?)\s*(think|search|answer|information)\s*>", re.IGNORECASE)


def truncate_at_first_action(text: str) -> str:
    """Cut `text` right after its first closing action tag (`</search>` or `</answer>`).

    Whichever closes first in the text wins, as with generation stop strings: a turn
    `<answer>a</answer> ... </search>` ends at `</answer>` (the episode is over, later
    text is never acted on). Text without either tag is returned unchanged.
    """
    ends = [i + len(tag) for tag in STOP_STRINGS if (i := text.find(tag)) >= 0]
    return text[: min(ends)] if ends else text


@dataclass(frozen=True)
class Action:
    """One parsed policy action. `model` is the registry's canonical name."""

    kind: Literal["route", "answer", "invalid", "none"]
    model: str | None = None
    query: str | None = None
    answer: str | None = None
    reason: str | None = None  # one of INVALID_REASONS when kind == "invalid"


def render_route(model: str, query: str) -> str:
    """The route text the policy is expected to write."""
    return f"{SEARCH_OPEN}{model}: {query}{SEARCH_CLOSE}"


def _squash(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


def _has_open_block(prefix: str) -> bool:
    return any(prefix.count(f"<{t}>") > prefix.count(f"</{t}>") for t in TAGS)


def _parse_route(before: str, registry: ModelRegistry) -> Action:
    start = before.rfind(SEARCH_OPEN)
    if start < 0 or _has_open_block(before[:start]):
        return Action("invalid", reason="nested_or_unclosed")
    content = before[start + len(SEARCH_OPEN):]
    if _ANY_TAG.search(content):
        return Action("invalid", reason="nested_or_unclosed")
    model, colon, query = content.partition(":")  # first colon only: "At 10:30, ..." stays whole
    model, query = model.strip(), query.strip()
    if _squash(content) == _squash(f"{PLACEHOLDER_MODEL}{PLACEHOLDER_QUERY}") or \
            _squash(model) == _squash(PLACEHOLDER_MODEL) or \
            (colon and _squash(query) == _squash(PLACEHOLDER_QUERY)):
        return Action("invalid", model=model or None, query=query or None, reason="placeholder")
    if not colon:
        return Action("invalid", reason="no_colon")
    if not model:
        return Action("invalid", query=query or None, reason="empty_model")
    if not query:
        return Action("invalid", model=model, reason="empty_query")
    spec = registry.resolve(model)
    if spec is None:
        return Action("invalid", model=model, query=query, reason="unknown_model")
    return Action("route", model=spec.name, query=query)


def parse_action(turn_text: str, registry: ModelRegistry) -> Action:
    """Parse the first complete action of a generated turn (see truncate_at_first_action).

    A route's model is resolved in `registry`; failures are `invalid` actions, never
    exceptions. For an answer, the text after the last `<answer>` before the first
    `</answer>` is taken ("<answer>a<answer>b</answer>" -> "b"; the format reward
    punishes the nesting). A turn without a closing action tag is kind "none".
    """
    turn = truncate_at_first_action(turn_text)
    if turn.endswith(SEARCH_CLOSE):
        return _parse_route(turn[: -len(SEARCH_CLOSE)], registry)
    if turn.endswith(ANSWER_CLOSE):
        before = turn[: -len(ANSWER_CLOSE)]
        start = before.rfind(ANSWER_OPEN)
        if start < 0:
            return Action("invalid", reason="nested_or_unclosed")
        return Action("answer", answer=before[start + len(ANSWER_OPEN):].strip())
    return Action("none")


def neutralize_tags(text: str) -> str:
    """Make our tags inert in foreign text: "<answer>" -> "(answer)", "</ Think >" -> "(/think)"."""
    return _LOOSE_TAG.sub(lambda m: f"({m.group(1)}{m.group(2).lower()})", text)


def whitespace_count(text: str) -> int:
    """Default token count: whitespace-separated words."""
    return len(text.split())


def whitespace_truncate(text: str, n: int) -> str:
    """Default truncation: the first `n` words, original spacing kept."""
    last = None
    for last in itertools.islice(re.finditer(r"\S+", text), max(n, 0)):
        pass
    return text[: last.end()] if last else ""


def wrap_information(body: str) -> str:
    """The observation block as appended to the context after a route."""
    return f"\n\n{INFO_OPEN}{body.strip()}{INFO_CLOSE}\n\n"


def format_observation(
    text: str | None,
    max_tokens: int,
    count_tokens: Callable[[str], int] | None = None,
    truncate: Callable[[str, int], str] | None = None,
) -> str:
    """Wrap a pool reply in `<information>`: surrogates cleaned, tags neutralised, body cut to `max_tokens`.

    `max_tokens` bounds the reply text; the tags come on top, so the closing tag always
    survives. `count_tokens`/`truncate` (e.g. a tokenizer's) come as a pair; default
    unit is whitespace words. `text=None` (a failed call) gives NO_REPLY_TEXT.
    """
    if max_tokens < 0:
        raise ValueError(f"format_observation: max_tokens must be >= 0, got {max_tokens}")
    if (count_tokens is None) != (truncate is None):
        raise ValueError("format_observation: pass count_tokens and truncate together (or neither)")
    count_tokens = count_tokens or whitespace_count
    truncate = truncate or whitespace_truncate
    body = NO_REPLY_TEXT if text is None else neutralize_tags(clean_text(text))
    if count_tokens(body) > max_tokens:
        # A tokenizer's decode cannot rebuild a tag from inert text, but re-check anyway.
        body = neutralize_tags(truncate(body, max_tokens))
    return wrap_information(body)


_HINTS = {
    "placeholder": "You copied the example. Write {example} with a model name from the list and your own question.",
    "no_colon": "A route needs a colon between the model name and the question, as in {example}.",
    "empty_model": "The model name before the colon is missing.",
    "empty_query": "The question after the colon is missing.",
    "unknown_model": "{model!r} is not a model of the pool.",
    "nested_or_unclosed": "Tags must be closed and not nested.",
    None: "No action found. Route with {example} or finish with <answer>...</answer>.",
}


def invalid_observation(action: Action, hint: bool = False, names: list[str] | None = None) -> str:
    """Observation after an invalid (or missing) action: empty, or a short corrective hint.

    `names` (the pool's model names) is listed in the hint when given.
    """
    if action.kind in ("route", "answer"):
        raise ValueError(f"invalid_observation: action of kind {action.kind!r} is valid")
    if not hint:
        return ""
    key = action.reason if action.kind == "invalid" else None
    msg = _HINTS.get(key, _HINTS[None]).format(example=ROUTE_EXAMPLE, model=action.model)
    if names and key in ("placeholder", "unknown_model", "empty_model"):
        msg += " Models: " + ", ".join(names) + "."
    return wrap_information(f"Your last action was invalid. {neutralize_tags(msg)}")
