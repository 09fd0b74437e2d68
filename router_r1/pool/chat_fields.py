"""The chat-completions fields both servers read, each checked with the field named (BadRequest, 400).

JSON gives a field any type, so each reader checks the type and the range before the value is used:
a string where a number belongs, a bool where an integer belongs, a seed past 64 bits, text with a
lone UTF-16 surrogate (valid JSON, `"\\ud800"`, that no tokenizer can encode).
"""
from __future__ import annotations

import math

from router_r1.pool.errors import BadRequest

ROLES = ("system", "user", "assistant", "developer", "tool")
MAX_TOKENS_LIMIT = 1 << 20  # larger asks are refused: no model here writes a million tokens
SEED_LIMIT = 1 << 63  # |seed| below this (torch.manual_seed takes 64 bits)


def text(value: str, field: str) -> str:
    """`value` if it encodes as UTF-8; a lone surrogate is refused, naming the field and the character."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadRequest(f"{field} holds a lone UTF-16 surrogate (character {e.start}); send text that is valid "
                         "Unicode", field) from None
    return value


def content_text(content: object, i: int) -> str:
    """messages[i].content as text: a string or a list of text parts (OpenAI's two shapes); anything else is refused."""
    field = f"messages[{i}].content"
    if isinstance(content, str):
        return text(content, field)
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return text("".join(p["text"] for p in content), field)
    if isinstance(content, list):
        kinds = sorted({p.get("type") if isinstance(p, dict) else type(p).__name__ for p in content}, key=str)
        raise BadRequest(f"{field} must be a string or a list of text parts; it holds parts of type {kinds} "
                         "(only text is read here)", field)
    got = "missing" if content is None else f"a JSON {_json_type(content)}"
    raise BadRequest(f"{field} must be a string or a list of text parts, got {got}", field)


def messages(body: dict) -> list[dict]:
    """body['messages'] as [{'role', 'content'}], each role one of ROLES and each content text."""
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'messages' must be a non-empty list", "messages")
    clean = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadRequest(f"messages[{i}] must be an object with 'role' one of {list(ROLES)}", f"messages[{i}].role")
        clean.append({"role": m["role"], "content": content_text(m.get("content"), i)})
    return clean


def number(body: dict, key: str, lo: float, hi: float, default: float | None, lo_open: bool = False) -> float | None:
    """body[key] as a float in [lo, hi] ((lo, hi] with lo_open); `default` when absent or null."""
    value = body.get(key)
    if value is None:
        return default
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not (lo < value if lo_open else lo <= value) or not value <= hi):
        raise BadRequest(f"'{key}' must be a number in {'(' if lo_open else '['}{lo:g}, {hi:g}], got "
                         f"{_shown(value)}", key)
    return float(value)


def integer(body: dict, key: str, lo: int, hi: int, default: int | None) -> int | None:
    """body[key] as an int in [lo, hi]; `default` when absent or null; a bool or a float is refused."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadRequest(f"'{key}' must be an integer in [{_bound(lo)}, {_bound(hi)}], got {_shown(value)}", key)
    return value


def max_tokens(body: dict, default: int | None) -> tuple[str, int | None]:
    """(the key used, its value): max_completion_tokens (OpenAI's newer name) wins over max_tokens."""
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return key, integer(body, key, 1, MAX_TOKENS_LIMIT, default)


def seed(body: dict) -> int | None:
    """body['seed'] with |seed| < 2**63, or None."""
    return integer(body, "seed", -SEED_LIMIT + 1, SEED_LIMIT - 1, None)


def _bound(n: int) -> str:
    return f"{'-' if n < 0 else ''}2**63-1" if abs(n) == SEED_LIMIT - 1 else f"{n:d}"


def _json_type(value: object) -> str:
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(value), type(value).__name__)


def _shown(value: object) -> str:
    """A short picture of a bad value: a 400-digit integer is not echoed whole."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 20:
        return f"an integer of {len(str(abs(value)))} digits"
    if isinstance(value, (int, float, bool)):
        return repr(value)
    return f"a JSON {_json_type(value)}"
