"""Prompt text: the router's instructions, pool descriptors, budget text, sub-model prompt.

All wording here is ours. A user who needs another template (for example the exact
prompt a published checkpoint was trained with) loads it from a file instead.
"""
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
