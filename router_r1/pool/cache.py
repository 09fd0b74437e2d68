"""On-disk cache of successful pool replies, so evaluation re-runs cost nothing and repeat exactly.

One JSON file per request, `<root>/<key[:2]>/<key>.json`, holding only the reply text and
token counts (never the endpoint or the API key). The key does not include the endpoint
URL, so use one cache directory per pool backend (a simulated pool and a hosted API
serving the same api ids must not share a directory).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)


def cache_key(api_id: str, messages: list[dict[str, str]], temperature: float, max_tokens: int,
              seed: int | None) -> str:
    """sha256 hex digest of everything that determines a pool reply."""
    blob = json.dumps([api_id, messages, float(temperature), int(max_tokens), seed],
                      sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CachedReply:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cut: bool = False  # the text was cut at the client's ReplyLimits.max_chars


def _is_count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


class ResponseCache:
    """Directory of cached replies; safe for many writers (write a temp file, then os.replace)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> CachedReply | None:
        """The cached reply, or None on a miss; an unreadable file is a miss plus a warning."""
        path = self.path(key)
        try:
            raw = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as e:
            log.warning("pool cache: cannot read %s (%s); ignoring it", path, e)
            return None
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, a number too long, nesting too deep
            log.warning("pool cache: corrupt file %s (not JSON: %s); ignoring it", path, e)
            return None
        if not (isinstance(doc, dict) and isinstance(doc.get("text"), str)
                and _is_count(doc.get("prompt_tokens")) and _is_count(doc.get("completion_tokens"))):
            log.warning("pool cache: corrupt file %s (expected text, prompt_tokens, completion_tokens); "
                        "ignoring it", path)
            return None
        return CachedReply(doc["text"], doc["prompt_tokens"], doc["completion_tokens"], doc.get("cut") is True)

    def put(self, key: str, reply: CachedReply) -> None:
        """Store atomically; a failed write is logged, not raised (the cache is an optimisation)."""
        path = self.path(key)
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, prefix=".tmp-",
                                             suffix=".json", delete=False) as f:
                tmp = f.name
                json.dump(asdict(reply), f, ensure_ascii=False)
            os.replace(tmp, path)
        except OSError as e:
            log.warning("pool cache: cannot write %s (%s); continuing without it", path, e)
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
