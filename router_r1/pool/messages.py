"""The text that crosses the pool boundary: the chat messages a routed sub-question is sent as, and replies
made valid Unicode. The pool client uses both; the router's prompts and observations build on them."""
from __future__ import annotations

SUBMODEL_SYSTEM = (
    "You are one expert in a panel that a routing assistant consults. Reply to the "
    "question below. If you know the answer, state it first, then at most two short "
    "sentences of support. If you only know related facts, give those. If you cannot "
    "help, say plainly that you do not know. Be brief."
)


def submodel_messages(query: str) -> list[dict[str, str]]:
    """Chat messages sent to a pool model for one routed sub-question."""
    return [
        {"role": "system", "content": SUBMODEL_SYSTEM},
        {"role": "user", "content": query.strip()},
    ]


def clean_text(text: str) -> str:
    """Foreign text as valid Unicode: a lone UTF-16 surrogate (valid JSON `"\\ud800"`, but no character) becomes
    U+FFFD, a pair is joined. Tokenizers and UTF-8 files refuse surrogates; the pool client cleans replies where
    they enter (router_r1/pool/client.py), observation building again on its own (router_r1/actions.py)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
