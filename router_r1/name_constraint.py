"""Constrained decoding of a route's model name: after `<search>`, only tokens that keep the text a prefix of
"<listed name>:" may be sampled, so a router that decided right cannot misspell the name ("SiliGLM-6B" for
SciGLM-6B, docs/results/h200/gemma_unseen/fallback). Everything else in the turn is decoded freely.

It changes the distribution the turn is sampled from, so it is for evaluation and serving (env.constrain_names),
never for rollouts whose log-probs train the policy. The hf engine applies it (SamplingParams.constraint).
"""
from __future__ import annotations

import bisect

from router_r1.actions import SEARCH_CLOSE, SEARCH_OPEN


class RouteNameConstraint:
    """`allowed(generated ids)`: the token ids that may come next while a route's name is open, else None."""

    def __init__(self, tokenizer, names: list[str]):
        if not names:
            raise ValueError("RouteNameConstraint needs at least one model name")
        self.tok = tokenizer
        self.targets = sorted({f"{n}:" for n in names})
        # each token's own text; tokens whose text is empty or a broken byte sequence never extend a name
        texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
        self._by_text: dict[str, list[int]] = {}
        for i, s in enumerate(texts):
            if s and "\ufffd" not in s:
                self._by_text.setdefault(s, []).append(i)
        self._sorted = sorted(self._by_text)  # for the tokens that run past a name's colon (": What")

    def open_name(self, generated: list[int]) -> str | None:
        """The name written so far after the turn's last `<search>`, or None when no name is open."""
        text = self.tok.decode(generated, skip_special_tokens=True)
        at = text.rfind(SEARCH_OPEN)
        if at < 0:
            return None
        partial = text[at + len(SEARCH_OPEN):]
        return None if ":" in partial or SEARCH_CLOSE in partial else partial

    def allowed(self, generated: list[int]) -> list[int] | None:
        """Ids whose text keeps the open name a prefix of a listed "name:" (or completes it and runs on); None
        when no name is open, or when what is written already matches no listed name (left to the parser)."""
        partial = self.open_name(generated)
        if partial is None:
            return None
        ids: set[int] = set()
        for target in self.targets:
            if not target.startswith(partial):
                continue
            rest = target[len(partial):]
            for k in range(1, len(rest) + 1):  # tokens inside the rest of the name
                ids.update(self._by_text.get(rest[:k], ()))
            lo = bisect.bisect_left(self._sorted, rest)  # tokens that end the name and run on
            while lo < len(self._sorted) and self._sorted[lo].startswith(rest):
                ids.update(self._by_text[self._sorted[lo]])
                lo += 1
        return sorted(ids) if ids else None
