"""Entity renaming for the SFT data: every name token of the world is seen being copied.

With a whole token per name, a small policy copies only the names its SFT data showed; about one test
question in five names a word it never saw, and the policy writes a name it knows instead
(docs/results/router_quality). Renaming a trajectory's names consistently (question, sub-questions,
replies, answer) to other names of the same kind keeps what the router must learn (route by the
relation, copy the entity) and spreads the copies over the whole lexicon. It uses the world's name
inventory, which the tokenizer already holds, never a test question or its facts.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from router_r1.pool.sim_world import SimWorld

_SUFFIX_TYPES = ("company", "band", "team")


@dataclass(frozen=True)
class NameClasses:
    """The world's name words by kind; a word is renamed only to another word of its kind."""

    by_word: dict[str, str]  # word -> kind
    words: dict[str, tuple[str, ...]]  # kind -> words

    @classmethod
    def from_world(cls, world: SimWorld, reserved: set[str] = frozenset()) -> "NameClasses":
        """Stems of people, places, companies, bands and teams; elements; symbols; genres.

        Suffixes ("Works", "Rovers") tell an entity's type and stay; words in `reserved` (the prompt
        template's) are never renamed.
        """
        suffixes = set()
        for etype in _SUFFIX_TYPES:
            suffixes |= {name.split()[-1] for name in world.by_type.get(etype, [])}
        kinds: dict[str, set[str]] = {"stem": set(), "element": set(), "symbol": set(), "genre": set()}
        for etype, names in world.by_type.items():
            kind = etype if etype in ("element", "symbol", "genre") else "stem"
            for name in names:
                kinds[kind].update(w for w in re.findall(r"\w+", name) if w not in suffixes)
        by_word = {w: k for k, ws in kinds.items() for w in ws if w not in reserved}
        words = {k: tuple(sorted(w for w in ws if w in by_word)) for k, ws in kinds.items()}
        return cls(by_word, words)

    def mapping(self, texts: list[str], rng: random.Random, decks: dict[str, list[str]]) -> dict[str, str]:
        """A one-to-one renaming of the name words in `texts` to words of the same kind.

        Targets come from `decks` (kind -> shuffled words, refilled when empty and kept between calls),
        so every word of the lexicon is used once before any is used twice.
        """
        present = sorted({w for t in texts for w in re.findall(r"\w+", t) if w in self.by_word})
        taken = set(present)
        out = {}
        for w in present:
            kind = self.by_word[w]
            deck = decks.setdefault(kind, [])
            for _ in range(2 * len(self.words[kind]) + 2):
                if not deck:
                    deck.extend(rng.sample(self.words[kind], len(self.words[kind])))
                new = deck.pop()
                if new not in taken:
                    break
            else:
                new = w  # a kind too small to rename into: keep the word
            taken.add(new)
            out[w] = new
        return out


def apply(mapping: dict[str, str], text: str) -> str:
    """`text` with every whole word in `mapping` replaced at once (no chained renames)."""
    if not mapping:
        return text
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(mapping, key=len, reverse=True))) + r")\b")
    return pattern.sub(lambda m: mapping[m.group(1)], text)
