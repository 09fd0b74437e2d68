"""Format check of a whole trajectory: the first gate of the reward.

`response` is the decoded response (policy turns and <information> blocks, without the
prompt, special tokens skipped). Rules, checked in this order:
  1. tags: every tag paired, none nested, nothing but whitespace outside blocks;
  2. start/answer/end: begins with <think>, exactly one <answer> block, which comes last;
  3. think: at least one non-empty <think> block;
  4. information: every </search> is directly followed by an <information> block and
     every <information> block directly follows a </search> (the policy wrote none);
  5. route: every <search> block is a valid route (protocol.parse_action).
"""
from __future__ import annotations

import re

from router_r1.pool.registry import ModelRegistry
from router_r1.protocol import parse_action

FORMAT_RULES = ("tags", "start", "answer", "end", "think", "information", "route")  # the reason's prefix
_TAG = re.compile(r"<(/?)(think|search|answer|information)>")


def _snippet(text: str, n: int = 30) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + "..."


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


def check_format(response: str, registry: ModelRegistry) -> tuple[bool, str]:
    """(True, "ok") or (False, "<rule>: <what broke>") for a full decoded response."""
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
