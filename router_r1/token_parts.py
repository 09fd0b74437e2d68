"""Which part of the routing protocol each response token belongs to, for the trainer's per-part metrics.

The parts: the think text, the model name of a route, the route's sub-question, the answer text, and a pool
model's name written inside the think (a router whose think says "Ask X." chooses there; the route's name then
only copies it); 0 is everything else (tags, whitespace between blocks, <information> blocks). The trainer reports
the advantage, the critic's value and the sampled tokens' surprisal per part (`part/<name>/...`): whether the
reward reaches the tokens that decide it (docs/rl_diagnosis.md section 13).
"""
from __future__ import annotations

import re

PART_NAMES = ("think", "route_model", "route_query", "answer", "think_model")  # ids 1..5; 0 is none of them
THINK_MODEL = 5

_BLOCKS = re.compile(r"<think>(.*?)</think>|<search>([^:<]*):(.*?)</search>|<answer>(.*?)</answer>", re.DOTALL)


def names_pattern(names) -> re.Pattern | None:
    """A regex for any of `names` (longest first, so a name is not cut at a shorter one it starts with)."""
    names = sorted({n for n in names if n}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, names))) if names else None


def char_parts(text: str, names: re.Pattern | None = None) -> list[int]:
    """Each character's part id (0: none); `names` (names_pattern) marks model names inside the think."""
    out = [0] * len(text)
    for m in _BLOCKS.finditer(text):
        for group, part in ((1, 1), (2, 2), (3, 3), (4, 4)):
            if m.group(group) is not None:
                out[m.start(group):m.end(group)] = [part] * (m.end(group) - m.start(group))
        if names is not None and m.group(1) is not None:
            for n in names.finditer(text, m.start(1), m.end(1)):
                out[n.start():n.end()] = [THINK_MODEL] * (n.end() - n.start())
    return out


def token_parts(token_texts: list[str], names: re.Pattern | None = None) -> list[int]:
    """Each token's part: that of its first non-space character (0 for a token of spaces only)."""
    parts = char_parts("".join(token_texts), names)
    out, pos = [], 0
    for t in token_texts:
        body = len(t) - len(t.lstrip())
        out.append(parts[pos + body] if body < len(t) else 0)
        pos += len(t)
    return out


def response_parts(tokenizer, response_ids: list[int], names: re.Pattern | None = None) -> list[int]:
    """token_parts of a response, each token decoded on its own (the tags are ASCII, so they survive a
    multi-byte character split across tokens)."""
    ids = [[i] for i in response_ids]
    return token_parts(tokenizer.batch_decode(ids, clean_up_tokenization_spaces=False), names)
