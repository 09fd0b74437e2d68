"""Redacting a secret from text a server sent back: the key itself and the forms an echo may take.

A server that echoes the Authorization header may upper- or lower-case it, reverse it, or send it
base64-encoded (alone or inside `Bearer <key>` / `user:<key>`, so at any of base64's three alignments),
hex-encoded or percent-encoded. Each form is replaced by `***`, case-insensitively.
"""
from __future__ import annotations

import base64
import re
import urllib.parse

MIN_KEY_CHARS = 6  # shorter "keys" ("EMPTY", "none") are placeholders, and their forms would hit ordinary text


def _base64_cores(key: bytes) -> list[str]:
    """The base64 characters that depend on the key's bytes alone, at each of the three byte alignments."""
    cores = []
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + key).decode()
        first = -(-shift // 3)  # first 3-byte group holding only key bytes
        last = (shift + len(key)) // 3  # one past the last such group
        if last > first:
            cores.append(encoded[4 * first:4 * last])
    return cores


def secret_forms(key: str) -> list[str]:
    """The spellings of `key` to take out of text, longest first."""
    if not key or len(key) < MIN_KEY_CHARS:
        return []
    raw = key.encode("utf-8")
    forms = {key, key[::-1], raw.hex(), urllib.parse.quote(key, safe="")}
    for core in _base64_cores(raw):
        forms |= {core, core.replace("+", "-").replace("/", "_")}  # standard and URL-safe alphabets
    return sorted((f for f in forms if len(f) >= MIN_KEY_CHARS), key=len, reverse=True)


def redact(text: str, key: str | None, mask: str = "***") -> str:
    """`text` with every form of `key` (secret_forms) replaced by `mask`, whatever its case."""
    forms = secret_forms(key or "")
    if not forms:
        return text
    return re.sub("|".join(map(re.escape, forms)), mask, text, flags=re.IGNORECASE)
