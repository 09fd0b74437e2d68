"""Entity renaming for the SFT data: every name of the world is seen being copied.

With a whole token per name, a small policy copies only the names its SFT data showed; about one test
question in five names a word it never saw, and the policy writes a name it knows instead
(docs/results/router_quality). Renaming a trajectory's entities consistently (question, sub-questions,
replies, answer) to other entities of the same type keeps what the router must learn (route by the
relation, copy the entity) and spreads the copies over the whole world. It uses the world's name
inventory, which the tokenizer already holds, never a test question or its facts.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import cached_property

from sim.world import SimWorld


@dataclass(frozen=True)
class EntityNames:
    """The world's names by type (entities, genres, symbols), each with the aliases a text may use."""

    by_type: dict[str, tuple[str, ...]]  # type -> names
    type_of: dict[str, str]  # name or alias -> type
    name_of: dict[str, str]  # name or alias -> the full name
    aliases: dict[str, tuple[str, ...]]  # full name -> aliases

    @classmethod
    def from_world(cls, world: SimWorld, reserved: set[str] = frozenset()) -> "EntityNames":
        """Every name of `world`; a name or alias in `reserved` (the prompt template's words) is left out."""
        by_type, type_of, name_of, aliases = {}, {}, {}, {}
        for etype, names in world.by_type.items():
            kept = []
            for name in names:
                entity = world.entities.get(name)
                al = entity.aliases if entity else ()
                if name in reserved or any(a in reserved for a in al):
                    continue
                kept.append(name)
                aliases[name] = al
                for key in (name, *al):
                    type_of[key], name_of[key] = etype, name
            by_type[etype] = tuple(kept)
        return cls(by_type, type_of, name_of, aliases)

    def mapping(self, texts: list[str], rng: random.Random, decks: dict[str, list[str]]) -> dict[str, str]:
        """A one-to-one renaming of the names (and their aliases) in `texts` to names of the same type.

        Targets come from `decks` (type -> shuffled names, refilled when empty and kept between calls),
        so every name is used once before any is used twice.
        """
        joined = "\n".join(texts)
        present = sorted({self.name_of[m.group(1)] for m in self.pattern.finditer(joined)})
        taken, out = set(present), {}
        for name in present:
            etype = self.type_of[name]
            deck, pool = decks.setdefault(etype, []), self.by_type[etype]
            for _ in range(2 * len(pool) + 2):
                if not deck:
                    deck.extend(rng.sample(pool, len(pool)))
                new = deck.pop()
                if new not in taken and len(self.aliases[new]) == len(self.aliases[name]):
                    break
            else:
                continue  # a type too small to rename into: keep the name
            taken.add(new)
            out[name] = new
            out.update(zip(self.aliases[name], self.aliases[new]))
        return out

    @cached_property
    def pattern(self) -> re.Pattern:
        """Any name or alias as a whole word, longest first (a full name before its alias)."""
        keys = sorted(self.type_of, key=len, reverse=True)
        return re.compile(r"\b(" + "|".join(map(re.escape, keys)) + r")\b")


def apply(mapping: dict[str, str], text: str) -> str:
    """`text` with every whole name in `mapping` replaced at once (no chained renames)."""
    if not mapping:
        return text
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(mapping, key=len, reverse=True))) + r")\b")
    return pattern.sub(lambda m: mapping[m.group(1)], text)
