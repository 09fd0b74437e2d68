"""Format check of a whole trajectory: the first gate of the reward.

`response` is the decoded response (policy turns, each cut at the end of its first
action, and <information> blocks; no prompt, special tokens skipped). Two rule sets:

reference (default): the published Router-R1 code's format check (the rules below, in words),
  so our rewards compare with its numbers. A response is valid when
    tags         it has a closed block, each tag opens as often as it closes, and no
                 block's content holds one of the eight tags (no nesting);
    think        every <think> block is non-empty and not just "...", and there is one;
    answer       there is exactly one <answer> block;
    information  there are as many <search> as <information> blocks;
    start, end   stripped, it starts with <think> and ends with </answer>;
    route        every route is valid: a colon, a known pool name before it, a non-empty
                 sub-question after it that does not contain that name, no placeholder.
  Free text between blocks is allowed. Kept fixes of the reference's defects: the route
  splits at its FIRST colon (the reference asks for exactly one colon, so "At 10:30"
  breaks it), names resolve exactly through the registry (case, spaces, hyphens,
  aliases; the reference matches substrings), and unknown names are invalid, never a
  crash. Tags in pool text are made inert before this check sees them (protocol.py).
strict: the set used before the reference's was adopted (kept to reproduce earlier
  runs): nothing but whitespace outside blocks, blocks in order (begins with <think>,
  the one <answer> last, every </search> directly followed by <information> and no
  <information> without one), at least one non-empty <think>, every route valid. It is
  not a superset of reference: it lets an empty or "..." <think> pass beside a non-empty
  one and does not check whether a sub-question names its model.

Both scan the text once (linear time): a response may be long and hostile.
"""
from __future__ import annotations

import re

from router_r1.pool.registry import ModelRegistry
from router_r1.actions import TAGS, parse_action

FORMAT_RULE_SETS = ("reference", "strict")
FORMAT_RULES = ("tags", "start", "answer", "end", "think", "information", "route")  # the reason's prefix
_TAG = re.compile(r"<(/?)(think|search|answer|information)>")
_OPEN = re.compile(r"<(think|search|answer|information)>")
_ALL_TAGS = tuple(f"<{t}>" for t in TAGS) + tuple(f"</{t}>" for t in TAGS)


def _snippet(text: str, n: int = 30) -> str:
    text = " ".join(text[: 4 * n].split())
    return text if len(text) <= n else text[:n] + "..."


# ---------------------------------------------------------------------------- reference

def closed_blocks(response: str) -> list[tuple[str, str]]:
    """(tag, content) of each closed block, as a lazy `<(tag)>(.*?)</tag>` scan finds them.

    Leftmost opening tag first, closed by the nearest closing tag of its name; blocks do
    not overlap; an opening tag with no closing tag after it is passed over. Linear: an
    opening tag that can never close is rejected by the position of its last closing tag.
    """
    last_close = {t: response.rfind(f"</{t}>") for t in TAGS}
    blocks, pos = [], 0
    while m := _OPEN.search(response, pos):
        name = m.group(1)
        if last_close[name] < m.end():
            pos = m.end()
            continue
        end = response.find(f"</{name}>", m.end())
        blocks.append((name, response[m.end():end]))
        pos = end + len(name) + 3
    return blocks


def _route_error(content: str, registry: ModelRegistry) -> str | None:
    """Why a route's content is invalid under the reference rules (with our fixes), or None."""
    action = parse_action(f"<search>{content}</search>", registry)
    if action.kind != "route":
        return action.reason
    written, _, query = content.partition(":")
    if written.strip().lower() in query.strip().lower():
        return "model_in_query"
    return None


def _check_reference(response: str, registry: ModelRegistry) -> tuple[bool, str]:
    blocks = closed_blocks(response)
    if not blocks:
        return False, "tags: no closed <think|search|answer|information> block"
    for t in TAGS:
        n_open, n_close = response.count(f"<{t}>"), response.count(f"</{t}>")
        if n_open != n_close:
            return False, f"tags: <{t}> opens {n_open} times and closes {n_close} times"
    for name, content in blocks:
        if any(tag in content for tag in _ALL_TAGS):
            return False, f"tags: a <{name}> block holds a tag (nesting)"
    names = [name for name, _ in blocks]
    if any(name == "think" and content.strip() in ("", "...") for name, content in blocks):
        return False, "think: a <think> block is empty or '...'"
    if names.count("answer") != 1:
        return False, f"answer: expected exactly one <answer> block, found {names.count('answer')}"
    if names.count("search") != names.count("information"):
        return False, (f"information: {names.count('search')} <search> blocks but "
                       f"{names.count('information')} <information> blocks")
    text = response.strip()
    if not text.startswith("<think>"):
        return False, "start: response must begin with <think>"
    if "think" not in names:  # implied by the start rule once tags balance; kept as the reference states it
        return False, "think: no <think> block"
    if not text.endswith("</answer>"):
        return False, f"end: response must end with </answer>, ends with {_snippet(text[-30:])!r}"
    routes = [content for name, content in blocks if name == "search"]
    for k, content in enumerate(routes):
        if why := _route_error(content, registry):
            return False, f"route: route {k + 1} is invalid ({why})"
    return True, "ok"


# ---------------------------------------------------------------------------- strict

def _blocks(response: str) -> tuple[list[tuple[str, str]], str | None]:
    """Split into (tag, content) blocks; the error string says what broke rule 1."""
    blocks, open_tag, open_end, last_end = [], None, 0, 0
    for m in _TAG.finditer(response):
        closing, name = m.group(1) == "/", m.group(2)
        if open_tag is None and response[last_end:m.start()].strip():
            return blocks, f"tags: text outside tags: {_snippet(response[last_end:m.start()])!r}"
        if not closing:
            if open_tag is not None:
                return blocks, f"tags: <{name}> opened inside <{open_tag}>"
            open_tag, open_end = name, m.end()
        else:
            if open_tag != name:
                return blocks, f"tags: </{name}> without a matching <{name}>"
            blocks.append((name, response[open_end:m.start()]))
            open_tag = None
        last_end = m.end()
    if open_tag is not None:
        return blocks, f"tags: <{open_tag}> not closed"
    if response[last_end:].strip():
        return blocks, f"tags: text outside tags: {_snippet(response[last_end:])!r}"
    return blocks, None


def _check_strict(response: str, registry: ModelRegistry) -> tuple[bool, str]:
    blocks, err = _blocks(response)
    if err:
        return False, err
    names = [name for name, _ in blocks]
    if not names or names[0] != "think":
        return False, "start: response must begin with <think>"
    if names.count("answer") != 1:
        return False, f"answer: expected exactly one <answer> block, found {names.count('answer')}"
    if names[-1] != "answer":
        return False, "end: the <answer> block must come last"
    if not any(content.strip() for name, content in blocks if name == "think"):
        return False, "think: every <think> block is empty"
    for i, name in enumerate(names):
        if name == "search" and (i + 1 == len(names) or names[i + 1] != "information"):
            return False, "information: a </search> is not followed by an <information> block"
        if name == "information" and (i == 0 or names[i - 1] != "search"):
            return False, "information: an <information> block does not follow a </search>"
    routes = [content for name, content in blocks if name == "search"]
    for k, content in enumerate(routes):
        action = parse_action(f"<search>{content}</search>", registry)
        if action.kind != "route":
            return False, f"route: route {k + 1} is invalid ({action.reason})"
    return True, "ok"


def check_format(response: str, registry: ModelRegistry, rules: str = "reference") -> tuple[bool, str]:
    """(True, "ok") or (False, "<rule>: <what broke>") for a full decoded response."""
    if rules == "reference":
        return _check_reference(response, registry)
    if rules == "strict":
        return _check_strict(response, registry)
    raise ValueError(f"format rules must be one of {'|'.join(FORMAT_RULE_SETS)}, got {rules!r}")
