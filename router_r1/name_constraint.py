"""Constrained decoding of a route's model name: when a turn opens `<search>`, the name written is one of the
pool's listed names followed by its colon, the one the policy itself scores likeliest as a whole. So a router that
decided right cannot misspell it ("SiliGLM-6B" for SciGLM-6B), and a slip's first letters do not steer the pick
(completing them token by token sent a router's "G" for GeoMind-3B to the dearer Gemma-2-27B-Instruct on the H200:
docs/results.md, "A model never seen in training"). Everything else in the turn is decoded freely.

It changes the distribution the turn is sampled from, so it is for evaluation and serving (env.constrain_names),
never for rollouts whose log-probs train the policy. The hf engine applies it (SamplingParams.constraint).
"""
from __future__ import annotations

from router_r1.actions import SEARCH_CLOSE, SEARCH_OPEN


class RouteNameConstraint:
    """`choices(generated ids)`: the token sequences that complete an open route name, else None."""

    def __init__(self, tokenizer, names: list[str]):
        if not names:
            raise ValueError("RouteNameConstraint needs at least one model name")
        self.tok = tokenizer
        self.targets = sorted({f"{n}:" for n in names})
        self._rests: dict[str, list[list[int]]] = {}  # the options, by the partial name written

    def open_name(self, generated: list[int]) -> str | None:
        """The name written so far after the turn's last `<search>`, or None when no name is open."""
        text = self.tok.decode(generated, skip_special_tokens=True)
        at = text.rfind(SEARCH_OPEN)
        if at < 0:
            return None
        partial = text[at + len(SEARCH_OPEN):]
        return None if ":" in partial or SEARCH_CLOSE in partial else partial

    def choices(self, generated: list[int]) -> list[list[int]] | None:
        """The ids of each listed "name:" that the open name is a prefix of, less what is written; None when no
        name is open, or when what is written already matches no listed name (left to the parser)."""
        partial = self.open_name(generated)
        if partial is None:
            return None
        if partial not in self._rests:
            rests = [t[len(partial):] for t in self.targets if t.startswith(partial)]
            if not rests:
                return None
            self._rests[partial] = [self.encode(r) for r in rests]
        return self._rests[partial]

    def encode(self, text: str) -> list[int]:
        """Ids that decode to exactly `text` after `<search>` (a tokenizer that prefixes a lone text with a space
        marker is read after the tag instead)."""
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        if self.tok.decode(ids, skip_special_tokens=True) != text:
            head = self.tok(SEARCH_OPEN, add_special_tokens=False)["input_ids"]
            both = self.tok(SEARCH_OPEN + text, add_special_tokens=False)["input_ids"]
            ids = both[len(head):] if both[:len(head)] == head else ids
        if self.tok.decode(ids, skip_special_tokens=True) != text:
            raise ValueError(f"RouteNameConstraint: the tokenizer cannot write {text!r} after {SEARCH_OPEN}")
        return ids
