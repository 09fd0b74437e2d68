"""Which part of the routing protocol each response token belongs to, for the trainer's per-part metrics.

The parts: the think text, the model name of a route, the route's sub-question, the answer text; 0 is
everything else (tags, whitespace between blocks, <information> blocks). The trainer reports the advantage, the
critic's value and the sampled tokens' surprisal per part (`part/<name>/...`), which is how one sees whether the
reward reaches the tokens that decide it (docs/rl_diagnosis.md).
"""
from __future__ import annotations

import re

PART_NAMES = ("think", "route_model", "route_query", "answer")  # ids 1..4; 0 is none of them

_BLOCKS = re.compile(r"<think>(.*?)</think>|<search>([^:<]*):(.*?)</search>|<answer>(.*?)</answer>", re.DOTALL)


def char_parts(text: str) -> list[int]:
    """Each character's part id (0: none)."""
    out = [0] * len(text)
    for m in _BLOCKS.finditer(text):
        for group, part in ((1, 1), (2, 2), (3, 3), (4, 4)):
            if m.group(group) is not None:
                out[m.start(group):m.end(group)] = [part] * (m.end(group) - m.start(group))
    return out


def token_parts(token_texts: list[str]) -> list[int]:
    """Each token's part: that of its first non-space character (0 for a token of spaces only)."""
    parts = char_parts("".join(token_texts))
    out, pos = [], 0
    for t in token_texts:
        body = len(t) - len(t.lstrip())
        out.append(parts[pos + body] if body < len(t) else 0)
        pos += len(t)
    return out


def response_parts(tokenizer, response_ids: list[int]) -> list[int]:
    """token_parts of a response, each token decoded on its own (the tags are ASCII, so they survive a
    multi-byte character split across tokens)."""
    return token_parts(tokenizer.batch_decode([[i] for i in response_ids], clean_up_tokenization_spaces=False))
